"""A TCP proxy on 127.0.0.1 in front of an HTTP server (the test's S3 store) that a test can make
misbehave, as a network or an overloaded store would. Commands come one per line on stdin; each
is answered on stdout with the command's name once it has taken effect:

  cut        connections are still accepted, nothing goes through either way, nothing is answered
  mend       the connections held while cut are dropped (clients reconnect); new ones go through
  slow MS    every answer is held MS milliseconds before it goes on
  fail CODE  every request is answered with HTTP CODE (an S3 error body), nothing reaches the store
  truncate   every request's head and half its body reach the store, then both sides are closed
  normal     no slowness, failure or truncation (a cut stays until mended)

Setting a mode drops the connections open so far, so that a client's next request meets it.
Prints "ready" once listening.

usage: tcp-proxy.py LISTEN_PORT TARGET_PORT"""
import asyncio
import sys

listen_port, target_port = int(sys.argv[1]), int(sys.argv[2])
open_ = None  # set while the proxy forwards
held = set()
mode = {"slow": 0.0, "fail": None, "truncate": False}


async def pipe(reader, writer, delay=False):
    try:
        while True:
            data = await reader.read(65536)
            if not data:
                break
            await open_.wait()
            if delay and mode["slow"]:
                await asyncio.sleep(mode["slow"])
            writer.write(data)
            await writer.drain()
    except (ConnectionError, asyncio.CancelledError):
        pass
    finally:
        writer.close()


async def read_request(reader):
    """The request's head and its body, or None at the end of the stream."""
    head = await reader.readuntil(b"\r\n\r\n")
    length = 0
    for line in head.split(b"\r\n"):
        name, _, value = line.partition(b":")
        if name.strip().lower() == b"content-length":
            length = int(value.strip())
    return head, length


async def fail(reader, writer, code):
    try:
        while True:
            head, length = await read_request(reader)
            await reader.readexactly(length)
            body = b"<?xml version=\"1.0\"?><Error><Code>SlowDown</Code><Message>injected by the test proxy</Message></Error>"
            writer.write(b"HTTP/1.1 %d Injected\r\nContent-Type: application/xml\r\nContent-Length: %d\r\n\r\n%s" % (code, len(body), body))
            await writer.drain()
    except (ConnectionError, asyncio.IncompleteReadError, asyncio.LimitOverrunError, ValueError):
        pass
    finally:
        writer.close()


async def truncate(reader, writer):
    try:
        upstream_reader, upstream_writer = await asyncio.open_connection("127.0.0.1", target_port)
        head, length = await read_request(reader)
        upstream_writer.write(head + await reader.readexactly(length // 2))
        await upstream_writer.drain()
        upstream_writer.close()
    except (OSError, asyncio.IncompleteReadError, asyncio.LimitOverrunError, ValueError):
        pass
    finally:
        writer.close()


async def handle(client_reader, client_writer):
    held.add(client_writer)
    try:
        await open_.wait()
        if mode["fail"] is not None:
            return await fail(client_reader, client_writer, mode["fail"])
        if mode["truncate"]:
            return await truncate(client_reader, client_writer)
        upstream_reader, upstream_writer = await asyncio.open_connection("127.0.0.1", target_port)
    except OSError:
        client_writer.close()
        return
    held.add(upstream_writer)
    await asyncio.gather(pipe(client_reader, upstream_writer), pipe(upstream_reader, client_writer, delay=True))
    held.discard(client_writer)
    held.discard(upstream_writer)


def drop_held():
    for writer in list(held):
        writer.close()
    held.clear()


def command(line):
    words = line.split()
    if not words:
        return
    name = words[0]
    if name == "cut":
        open_.clear()
    elif name == "mend":
        # What was held while cut is dropped, as a network that lost it would: clients reconnect.
        drop_held()
        open_.set()
    elif name == "slow":
        mode["slow"] = int(words[1]) / 1000
        drop_held()
    elif name == "fail":
        mode["fail"] = int(words[1])
        drop_held()
    elif name == "truncate":
        mode["truncate"] = True
        drop_held()
    elif name == "normal":
        mode.update(slow=0.0, fail=None, truncate=False)
        drop_held()
    else:
        name = "unknown " + name
    print(name, flush=True)


async def main():
    global open_
    open_ = asyncio.Event()
    open_.set()
    loop = asyncio.get_running_loop()
    server = await asyncio.start_server(handle, "127.0.0.1", listen_port)
    print("ready", flush=True)
    async with server:
        while True:
            line = await loop.run_in_executor(None, sys.stdin.readline)
            if not line:
                return  # the test went away
            command(line)


asyncio.run(main())
