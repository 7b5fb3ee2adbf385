# -*- coding: utf-8 -*-
# Copyright: constellation.cluster contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""ssh's ProxyCommand for the lab (lab/ssh.py): ``ssh_proxy.py HOST PORT`` connects to HOST:PORT and relays
between that connection and its standard input and output. The lab's ``ssh-proxy`` wrapper runs it in the admin
machine's namespace, where the lab's addresses are routed. Standalone: no import of the lab or the collection."""

from __future__ import annotations

import os
import selectors
import socket
import sys


def relay(host: str, port: int) -> int:
    sock = socket.create_connection((host, port), timeout=10)
    sock.settimeout(None)
    selector = selectors.DefaultSelector()
    selector.register(0, selectors.EVENT_READ)
    selector.register(sock, selectors.EVENT_READ)
    while True:
        for key, _events in selector.select():
            if key.fileobj == 0:
                data = os.read(0, 65536)
                if not data:  # ssh closed its side: half-close ours, keep reading the answer
                    selector.unregister(0)
                    sock.shutdown(socket.SHUT_WR)
                    continue
                sock.sendall(data)
            else:
                data = sock.recv(65536)
                if not data:
                    return 0
                view = memoryview(data)
                while view:
                    view = view[os.write(1, view):]


if __name__ == "__main__":
    if len(sys.argv) != 3:
        sys.stderr.write("usage: ssh_proxy.py HOST PORT\n")
        sys.exit(2)
    try:
        sys.exit(relay(sys.argv[1], int(sys.argv[2])))
    except OSError as err:
        sys.stderr.write("ssh_proxy: %s:%s: %s\n" % (sys.argv[1], sys.argv[2], err))
        sys.exit(1)
