"""Keeps every Python that scripts/peer.sh starts off the network (it puts this folder on PYTHONPATH).

Ultralytics 8.0.232 has no offline switch: importing it probes 1.1.1.1, 8.8.8.8 and 223.5.5.5 on port 53
(`ultralytics.utils.is_online`, up to 2 s each where packets are dropped), and what it does when it believes it is
online (analytics events, the PyPI update check, a missing font or weight file) reaches ultralytics.com, GitHub or
PyPI. Here name lookups and connections to anything but the loopback fail at once with OSError, which Ultralytics
treats as offline. The three probes are refused silently; any other attempt is reported on stderr, and
YOLO8_PEER_NETLOG=FILE appends every refused attempt to FILE (scripts/peer_check.sh counts them).
YOLO8_PEER_NETWORK=1 leaves the network alone.
"""
import errno
import ipaddress
import os
import socket
import sys

_PROBES = {("1.1.1.1", 53), ("8.8.8.8", 53), ("223.5.5.5", 53)}


def _is_local(host):
    if host in (None, "", "localhost", b"localhost"):
        return True
    try:
        return ipaddress.ip_address(host.decode() if isinstance(host, bytes) else host).is_loopback
    except ValueError:
        return False


def _refuse(host, port):
    host = host.decode() if isinstance(host, bytes) else host
    where = f"{host}:{port}"
    log = os.environ.get("YOLO8_PEER_NETLOG")
    if log:
        with open(log, "a") as f:
            f.write(f"{where} {' '.join(sys.argv[:1])}\n")
    if (host, port) not in _PROBES:
        print(f"peer.sh: offline, refused a connection to {where}", file=sys.stderr)
    raise OSError(errno.ENETUNREACH, f"network disabled by scripts/peer.sh ({where})")


if os.environ.get("YOLO8_PEER_NETWORK") != "1":
    _getaddrinfo = socket.getaddrinfo
    _connect = socket.socket.connect
    _connect_ex = socket.socket.connect_ex

    def getaddrinfo(host, port, *args, **kwargs):
        if not _is_local(host):
            _refuse(host, port)
        return _getaddrinfo(host, port, *args, **kwargs)

    def _check(sock, address):
        if sock.family in (socket.AF_INET, socket.AF_INET6) and not _is_local(address[0]):
            _refuse(address[0], address[1])

    def connect(self, address):
        _check(self, address)
        return _connect(self, address)

    def connect_ex(self, address):
        _check(self, address)
        return _connect_ex(self, address)

    socket.getaddrinfo = getaddrinfo
    socket.socket.connect = connect
    socket.socket.connect_ex = connect_ex
