"""The TCP sockets a process tree listens on, from /proc (psutil where installed is not needed): every
socket inode in /proc/<pid>/fd matched against /proc/net/tcp and tcp6 rows in state LISTEN (0A)."""
from __future__ import annotations

import os
import socket
import struct

LISTEN = "0A"


def process_tree(root: int) -> list[int]:
    """``root`` and all its descendants (from /proc/<pid>/stat's parent field)."""
    parents: dict[int, list[int]] = {}
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat") as f:
                ppid = int(f.read().rsplit(")", 1)[1].split()[1])
        except (OSError, ValueError, IndexError):
            continue
        parents.setdefault(ppid, []).append(int(name))
    out, todo = [], [root]
    while todo:
        pid = todo.pop()
        out.append(pid)
        todo.extend(parents.get(pid, []))
    return out


def _address(hex_addr: str, v6: bool) -> str:
    ip, port = hex_addr.split(":")
    raw = bytes.fromhex(ip)
    if v6:
        # four little-endian 32-bit words
        raw = b"".join(struct.pack(">I", w) for w in struct.unpack("<4I", raw))
        return f"[{socket.inet_ntop(socket.AF_INET6, raw)}]:{int(port, 16)}"
    return f"{socket.inet_ntop(socket.AF_INET, raw[::-1])}:{int(port, 16)}"


def _listen_rows() -> dict[str, str]:
    """socket inode -> local address, for every listening TCP socket of this network namespace."""
    rows = {}
    for path, v6 in (("/proc/net/tcp", False), ("/proc/net/tcp6", True)):
        try:
            with open(path) as f:
                lines = f.read().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            cols = line.split()
            if cols[3] == LISTEN:
                rows[cols[9]] = _address(cols[1], v6)
    return rows


def listening_sockets(pids) -> list[tuple[int, str, str]]:
    """(pid, command, local address) of every listening TCP socket the processes hold."""
    rows, out = _listen_rows(), []
    for pid in pids:
        try:
            fds = os.listdir(f"/proc/{pid}/fd")
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                cmd = f.read().replace(b"\0", b" ").decode(errors="replace")[:120]
        except OSError:
            continue
        for fd in fds:
            try:
                target = os.readlink(f"/proc/{pid}/fd/{fd}")
            except OSError:
                continue
            if target.startswith("socket:[") and target[8:-1] in rows:
                out.append((pid, cmd, rows[target[8:-1]]))
    return out


def is_loopback(address: str) -> bool:
    host = address.rsplit(":", 1)[0].strip("[]")
    return host.startswith("127.") or host in ("::1", "::ffff:127.0.0.1") or host.startswith("::ffff:127.")
