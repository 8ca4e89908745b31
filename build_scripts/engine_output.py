"""Where `dasc-build` writes: a temporary sibling directory, renamed into place when complete.

- a reader never sees half an engine: the engine is built in ``.NAME.building-XXXX`` beside the output and
  renamed over it (an atomic exchange with an old engine where the kernel offers renameat2);
- ``--force`` replaces an engine directory only (its config.json carries ``dasc_engine_version``, the
  marker `dasc serve` recognises engines by), never a directory of anything else, a file or a link; checked
  when the build begins and again as it publishes (a directory made at the output meanwhile is left alone);
- a lock file beside the output (``.NAME.dasc-build.lock``, flock'ed, removed when done) refuses a second
  build of the same output while one runs;
- an OS error (a read-only or virtual file system, a full disk) is one UserError line, naming the file being
  written as inside the output (never the temporary directory, nor the checkpoint file it was copied from).
"""
from __future__ import annotations

import contextlib
import ctypes
import errno
import fcntl
import glob
import os
import secrets
import shutil
import tempfile

from trtllm_dasc.engine_dir import VERSION_KEY as ENGINE_MARKER
from trtllm_dasc.engine_dir import is_engine_dir
from trtllm_dasc.errors import UserError

# linux renameat2 flag: swap two existing paths in one step
_RENAME_EXCHANGE = 2
_AT_FDCWD = -100


def check_output(output: str, force: bool) -> None:
    """Refuse an output path we must not write or replace (one line), before any work is done."""
    out = os.path.abspath(output)
    if os.path.islink(out):
        raise UserError(f"--output {output!r} is a symbolic link: refusing to replace it, give the real path")
    if os.path.lexists(out):
        if not os.path.isdir(out):
            raise UserError(f"--output {output!r} exists and is not a directory: refusing to replace it")
        try:
            empty = not os.listdir(out)
        except OSError as e:
            raise UserError(f"--output {output!r} cannot be listed: {e.strerror or e}") from None
        if not empty and not force:
            raise UserError(f"--output {output!r} exists and is not empty: pass --force to replace it")
        if not empty and not is_engine_dir(out):
            raise UserError(f"--output {output!r} is not a dasc engine directory (no config.json with "
                            f"{ENGINE_MARKER}): --force replaces engines only; remove it yourself or choose "
                            "another --output")
    parent = os.path.dirname(out)
    if not os.path.isdir(parent) or not os.access(parent, os.W_OK):
        raise UserError(f"--output: directory {parent!r} does not exist or is not writable")
    # root passes access() on /proc, /sys and read-only mounts: an invisible file tells (O_TMPFILE)
    try:
        with tempfile.TemporaryFile(dir=parent):
            pass
    except OSError as e:
        raise UserError(f"--output: cannot write in {parent!r}: {e.strerror or e}") from None


def _as_published(path: str, tmp: str | None, out: str | None) -> str:
    """A path inside the building directory ``tmp`` as it will be once published: inside ``out``."""
    if tmp and out and (path == tmp or path.startswith(tmp + os.sep)):
        return out + path[len(tmp):]
    return path


def os_error_line(e: OSError, doing: str, tmp: str | None = None, out: str | None = None) -> UserError:
    """One line naming the file the error is about: of an error's two paths (shutil's copy gives the source
    and the destination, the source first) the one being written in the building directory ``tmp``, named
    as inside ``out`` (the directory the user asked for), never the checkpoint read or the temporary name."""
    names = [os.fsdecode(f) for f in (e.filename, e.filename2) if f is not None]
    inside = [f for f in names if _as_published(f, tmp, out) != f]
    name = (inside or names or [None])[0]
    where = f" ({_as_published(name, tmp, out)})" if name else ""
    return UserError(f"{doing}: {e.strerror or e}{where}")


class OutputLock:
    """An exclusive flock on ``.NAME.dasc-build.lock`` beside the output; refuses (one line) when held."""

    def __init__(self, output: str):
        out = os.path.abspath(output)
        self.output = output
        self.path = os.path.join(os.path.dirname(out), f".{os.path.basename(out)}.dasc-build.lock")
        self.fd: int | None = None

    def __enter__(self) -> "OutputLock":
        while True:
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                holder = os.read(fd, 32).decode(errors="replace").strip() or "?"
                os.close(fd)
                raise UserError(f"another dasc-build (pid {holder}) is building --output {self.output!r}: wait "
                                f"for it, or remove {self.path} if no build runs") from None
            # the holder before us unlinks the file on release: a lock on an unlinked file locks nothing
            try:
                same = os.path.samestat(os.fstat(fd), os.stat(self.path))
            except FileNotFoundError:
                same = False
            if same:
                break
            os.close(fd)
        os.ftruncate(fd, 0)
        os.write(fd, str(os.getpid()).encode())
        self.fd = fd
        return self

    def __exit__(self, *exc) -> None:
        # unlink while still holding the lock: a waiter that opened the old file sees it gone and retries
        with contextlib.suppress(OSError):
            os.unlink(self.path)
        os.close(self.fd)
        self.fd = None


def _exchange(a: str, b: str) -> bool:
    """Swap two existing paths atomically (linux renameat2); False where the kernel or libc cannot."""
    try:
        fn = ctypes.CDLL(None, use_errno=True).renameat2
    except (AttributeError, OSError):
        return False
    rc = fn(_AT_FDCWD, os.fsencode(a), _AT_FDCWD, os.fsencode(b), _RENAME_EXCHANGE)
    if rc == 0:
        return True
    err = ctypes.get_errno()
    if err in (errno.ENOSYS, errno.EINVAL, errno.ENOTSUP):
        return False
    raise OSError(err, os.strerror(err), b)


def _sibling(out: str, kind: str) -> str:
    """A new empty directory beside ``out`` (mkdir: the user's umask, not mkdtemp's 0700)."""
    path = os.path.join(os.path.dirname(out), f".{os.path.basename(out)}.{kind}-{os.getpid()}-{secrets.token_hex(4)}")
    os.mkdir(path)
    return path


def _replaceable(path: str, force: bool) -> bool:
    """Whether the directory ``path`` may be replaced: empty, or with --force a dasc engine."""
    return not os.listdir(path) or (force and is_engine_dir(path))


def _appeared(output: str) -> UserError:
    return UserError(f"--output {output!r} appeared during the build, and is not an engine --force may replace: "
                     "left as it was, the new engine not kept; remove it or choose another --output")


def publish(tmp: str, out: str, force: bool, output: str) -> None:
    """Move the complete engine ``tmp`` to ``out``: a plain rename onto a missing or empty directory, an
    exchange with an old engine (then removed). What stands at ``out`` was checked before the build's work;
    a directory made there since (a user's mkdir and copy during a long build) is refused and left as it was,
    checked again after the exchange, so even one made in between is swapped back, never removed."""
    parent = os.path.dirname(out)
    if os.path.isdir(out) and os.listdir(out):
        if not _replaceable(out, force):
            raise _appeared(output)
        if _exchange(tmp, out):
            if not _replaceable(tmp, force):
                _exchange(tmp, out)
                raise _appeared(output)
            shutil.rmtree(tmp, ignore_errors=True)
        else:
            # two renames: the old engine steps aside (and comes back if the new one cannot move in)
            old = _sibling(out, "replaced")
            os.rename(out, old)
            try:
                if not _replaceable(old, force):
                    raise _appeared(output)
                os.rename(tmp, out)
            except (OSError, UserError):
                os.rename(old, out)
                raise
            shutil.rmtree(old, ignore_errors=True)
    else:
        os.rename(tmp, out)
    # the rename itself durable: the parent directory's entry on disk
    with contextlib.suppress(OSError):
        fd = os.open(parent, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


@contextlib.contextmanager
def staged_output(output: str, force: bool):
    """Yields a fresh temporary directory beside ``output``; on a clean exit it becomes ``output``, on any
    error it is removed and ``output`` is untouched. OS errors come out as one UserError line."""
    out = os.path.abspath(output)
    tmp = None
    try:
        with OutputLock(out):
            # again under the lock: another build may have finished since the first check
            check_output(output, force)
            # under the lock no other build of this output runs: a building directory left is a killed build's
            for stale in glob.glob(os.path.join(glob.escape(os.path.dirname(out)),
                                                f".{glob.escape(os.path.basename(out))}.building-*")):
                shutil.rmtree(stale, ignore_errors=True)
            tmp = _sibling(out, "building")
            yield tmp
            publish(tmp, out, force, output)
            tmp = None
    except OSError as e:
        raise os_error_line(e, f"cannot build {output!r}", tmp, out) from None
    except UserError as e:
        # a writer's own one line (a rank's weights file) names the file as it will be: inside the output
        if tmp is not None and tmp in str(e):
            e.args = (str(e).replace(tmp, out),)
        raise
    finally:
        if tmp is not None:
            shutil.rmtree(tmp, ignore_errors=True)
