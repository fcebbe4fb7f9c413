"""sha256 of a file on the device: the agent's one copy, and a standalone script.

The SSH transport runs this file's text as ``python -S -c TEXT PATH [SIZE IDLE]`` to check
uploads, the agent's own included (so it cannot wait for the agent to be on the device):
stdlib only, no imports from the package. With SIZE it *follows* a file still being
written, reading it as it grows up to SIZE bytes, so an upload is hashed while it arrives;
after IDLE seconds without growth it prints ``stalled N`` and exits 4. While following it
also fsyncs the file every FLUSH_EVERY bytes, so the disk writes overlap the transfer and the
uploader's final fsync only waits for the tail.
"""

import hashlib
import os
import sys
import time

FLUSH_EVERY = 32 << 20


def sha256_file(path: str, size: int = -1, idle: float = 0.0, flush_every: int = 0) -> str:
    """The file's sha256; with ``size`` >= 0, of its first ``size`` bytes, waiting up to ``idle``
    seconds at a time for them to arrive (raises TimeoutError with the count read so far).
    ``flush_every`` > 0: fsync the file each time that many more bytes were read."""
    h, done, last, nap, flushed = hashlib.sha256(), 0, time.time(), 0.001, 0
    with open(path, "rb") as fh:
        while size < 0 or done < size:
            block = fh.read(1 << 20 if size < 0 else min(1 << 20, size - done))
            if block:
                h.update(block)
                done += len(block)
                last, nap = time.time(), 0.001
                if flush_every > 0 and done - flushed >= flush_every:
                    flushed = done
                    try:
                        os.fsync(fh.fileno())  # Linux flushes a file's dirty pages through any descriptor
                    except OSError:
                        flush_every = 0  # not here: the uploader's own fsync does it all
            elif size < 0:
                break
            elif time.time() - last > idle:
                raise TimeoutError(done)
            else:
                time.sleep(nap)
                nap = min(nap * 2, 0.02)
    return h.hexdigest()


if __name__ == "__main__":
    args = sys.argv[1:]
    size, idle = (int(args[1]), float(args[2])) if len(args) == 3 else (-1, 0.0)
    try:
        print(sha256_file(args[0], size, idle, FLUSH_EVERY if size >= 0 else 0))
    except TimeoutError as exc:
        print(f"stalled {exc.args[0]}")
        sys.exit(4)
