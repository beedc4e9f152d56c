"""Calls a CSI endpoint with Python grpcio's default channel settings.

Usage: python3 python_client.py unix:///path/to/csi.sock

grpcio (gRPC C-core) sends the socket path, percent-encoded, as :authority.
The protobuf messages are handled as raw bytes (the requests are empty
messages), so no generated stubs are needed. Prints one line per call and
exits non-zero on the first failure.
"""

import sys

import grpc


def fields(data):
    """(field number, wire type, value) of a protobuf message, top level."""
    i = 0
    while i < len(data):
        key, i = varint(data, i)
        number, wire = key >> 3, key & 7
        if wire == 0:
            value, i = varint(data, i)
        elif wire == 2:
            size, i = varint(data, i)
            value, i = data[i:i + size], i + size
        elif wire == 1:
            value, i = data[i:i + 8], i + 8
        elif wire == 5:
            value, i = data[i:i + 4], i + 4
        else:
            raise ValueError("unexpected wire type %d" % wire)
        yield number, wire, value


def varint(data, i):
    shift = result = 0
    while True:
        b = data[i]
        i += 1
        result |= (b & 0x7F) << shift
        if not b & 0x80:
            return result, i
        shift += 7


def call(channel, method):
    identity = lambda b: b
    rpc = channel.unary_unary(method, request_serializer=identity,
                              response_deserializer=identity)
    return rpc(b"", timeout=10)


def main():
    target = sys.argv[1]
    # Default settings: no grpc.default_authority override.
    with grpc.insecure_channel(target) as channel:
        info = dict((n, v) for n, _, v in fields(call(channel, "/csi.v1.Identity/GetPluginInfo")))
        name = info.get(1, b"").decode()
        if not name:
            raise SystemExit("GetPluginInfo: empty name")
        print("GetPluginInfo name=%s vendor_version=%s" % (name, info.get(2, b"").decode()))

        probe = dict((n, v) for n, _, v in fields(call(channel, "/csi.v1.Identity/Probe")))
        ready = dict((n, v) for n, _, v in fields(probe.get(1, b""))).get(1, 0) if 1 in probe else None
        if ready == 0:
            raise SystemExit("Probe: ready=false")
        print("Probe ready=%s" % ("unset" if ready is None else bool(ready)))

        caps = [v for n, _, v in fields(call(channel, "/csi.v1.Node/NodeGetCapabilities")) if n == 1]
        print("NodeGetCapabilities capabilities=%d" % len(caps))
    print("grpcio %s: ok" % grpc.__version__)


if __name__ == "__main__":
    try:
        main()
    except grpc.RpcError as e:
        print("RPC failed: %s: %s" % (e.code(), e.details()), file=sys.stderr)
        sys.exit(1)
