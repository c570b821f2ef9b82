"""A TCP proxy on 127.0.0.1 that a test can cut, as a network would: SIGUSR1 cuts it (connections
are still accepted, nothing goes through either way, nothing is answered), SIGUSR2 mends it (the
connections held meanwhile are dropped; new ones go through). Prints "ready" once listening, and
"cut" / "mended" once a signal has taken effect, so a test knows nothing passes from then on.

usage: tcp-proxy.py LISTEN_PORT TARGET_PORT"""
import asyncio
import signal
import sys

listen_port, target_port = int(sys.argv[1]), int(sys.argv[2])
open_ = None  # set while the proxy forwards
held = set()


async def pipe(reader, writer):
    try:
        while True:
            data = await reader.read(65536)
            if not data:
                break
            await open_.wait()
            writer.write(data)
            await writer.drain()
    except (ConnectionError, asyncio.CancelledError):
        pass
    finally:
        writer.close()


async def handle(client_reader, client_writer):
    held.add(client_writer)
    try:
        await open_.wait()
        upstream_reader, upstream_writer = await asyncio.open_connection("127.0.0.1", target_port)
    except OSError:
        client_writer.close()
        return
    held.add(upstream_writer)
    await asyncio.gather(pipe(client_reader, upstream_writer), pipe(upstream_reader, client_writer))
    held.discard(client_writer)
    held.discard(upstream_writer)


def cut():
    open_.clear()
    print("cut", flush=True)


def mend():
    # What was held while cut is dropped, as a network that lost it would: clients reconnect.
    for writer in list(held):
        writer.close()
    held.clear()
    open_.set()
    print("mended", flush=True)


async def main():
    global open_
    # A test process may have these blocked, and a child inherits the mask.
    signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGUSR1, signal.SIGUSR2})
    open_ = asyncio.Event()
    open_.set()
    loop = asyncio.get_running_loop()
    loop.add_signal_handler(signal.SIGUSR1, cut)
    loop.add_signal_handler(signal.SIGUSR2, mend)
    server = await asyncio.start_server(handle, "127.0.0.1", listen_port)
    print("ready", flush=True)
    async with server:
        await server.serve_forever()


asyncio.run(main())
