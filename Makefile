# The two commands of the repository's README (.github/README.md): `make demo` and `make test`. Each does its own set-up.
SHELL := /bin/bash
VENV := .venv/bin
export PATH := $(CURDIR)/.venv/bin:$(PATH)
export ANSIBLE_CONFIG := $(CURDIR)/ansible.cfg
HOSTS ?= 4
# How many of the lab's first hosts are Coordinators (odd; with more than one, each runs an etcd member).
COORDINATORS ?= 1

.PHONY: setup demo test test-image pytest units sanity lint molecule lab-up lab-down lab-status bench build fuzz image

setup:
	@sh scripts/setup.sh

demo: setup
	HOSTS=$(HOSTS) COORDINATORS=$(COORDINATORS) sh scripts/demo.sh

# Unit tests run through ansible-test units (as collection users run them), integration tests
# through pytest, then ansible-lint, and ansible-test sanity and the build while Molecule runs.
test: setup
	sh scripts/units.sh
	$(VENV)/pytest -q -p no:cacheprovider -n 2 --dist loadfile -m "not image" tests/integration
	$(MAKE) --no-print-directory test-image
	sh scripts/checks-and-molecule.sh

# The node image booted under QEMU (tests/integration/test_image_boot.py, docs/image.md): on its own, after the
# lab tests, because TCG takes a whole core for minutes and the lab's timing-bound waits share the other one.
test-image: setup
	$(VENV)/pytest -q -p no:cacheprovider -m image tests/integration

pytest: setup
	$(VENV)/pytest -q -p no:cacheprovider || [ $$? -eq 5 ]  # 5: no test collected

units: setup
	sh scripts/units.sh

sanity: setup
	sh scripts/sanity.sh

lint: setup
	$(VENV)/ansible-lint --profile production

molecule: setup
	sh scripts/molecule.sh

build: setup
	sh scripts/build-collection.sh /tmp/constellation-build >/dev/null
	@echo "collection build: ok"

# The node image (docs/image.md): IMAGE_EK_CA (PEM of the TPM vendor CAs), IMAGE_SIGNING_KEY (the measurements
# signing key) and IMAGE_POLICY (the signed document the image's agent checks its peers with) are required;
# IMAGE_OUT defaults to $$CONSTELLATION_IMAGE_CACHE/out; DEBUG=1 builds the debug variant.
image: setup
	$(VENV)/python -m image build --ek-ca "$(IMAGE_EK_CA)" --signing-key "$(IMAGE_SIGNING_KEY)" \
		--policy "$(IMAGE_POLICY)" $(if $(IMAGE_OUT),--out "$(IMAGE_OUT)") $(if $(DEBUG),--debug)

lab-up: setup
	$(VENV)/python -m lab up --hosts $(HOSTS) --coordinators $(COORDINATORS)

lab-down: setup
	$(VENV)/python -m lab down

lab-status: setup
	$(VENV)/python -m lab status

# Every parser of untrusted data, 100,000+ mutated inputs each (scripts/fuzz.py); exit 1 on a foreign exception.
fuzz: setup
	$(VENV)/python scripts/fuzz.py

bench: setup
	@for b in bench/*.py; do echo "== $$b"; $(VENV)/python $$b || exit 1; done
