// Calls a CSI endpoint with grpc-java's default channel settings.
//
// Usage: java -Djava.library.path=DIR -cp 'JARS' JavaClient.java /path/to/csi.sock
//
// grpc-java over netty's epoll domain socket transport, as a Java CO or
// sidecar dials a CSI socket: the channel's authority is the socket path,
// which grpc-java sends as :authority. The protobuf messages are handled as
// raw bytes (the requests are empty messages) and read with protobuf-java's
// UnknownFieldSet, so no generated stubs are needed. Prints one line per
// call and exits non-zero on the first failure.

import com.google.protobuf.ByteString;
import com.google.protobuf.UnknownFieldSet;
import io.grpc.CallOptions;
import io.grpc.ManagedChannel;
import io.grpc.MethodDescriptor;
import io.grpc.StatusRuntimeException;
import io.grpc.netty.NettyChannelBuilder;
import io.grpc.stub.ClientCalls;
import io.netty.channel.epoll.Epoll;
import io.netty.channel.epoll.EpollDomainSocketChannel;
import io.netty.channel.epoll.EpollEventLoopGroup;
import io.netty.channel.unix.DomainSocketAddress;
import java.io.ByteArrayInputStream;
import java.io.IOException;
import java.io.InputStream;
import java.io.UncheckedIOException;
import java.util.List;
import java.util.concurrent.TimeUnit;

public class JavaClient {
    static final MethodDescriptor.Marshaller<byte[]> BYTES = new MethodDescriptor.Marshaller<>() {
        public InputStream stream(byte[] value) {
            return new ByteArrayInputStream(value);
        }

        public byte[] parse(InputStream stream) {
            try {
                return stream.readAllBytes();
            } catch (IOException e) {
                throw new UncheckedIOException(e);
            }
        }
    };

    static UnknownFieldSet call(ManagedChannel channel, String method) throws IOException {
        MethodDescriptor<byte[], byte[]> descriptor = MethodDescriptor.<byte[], byte[]>newBuilder()
            .setType(MethodDescriptor.MethodType.UNARY)
            .setFullMethodName(method)
            .setRequestMarshaller(BYTES)
            .setResponseMarshaller(BYTES)
            .build();
        CallOptions options = CallOptions.DEFAULT.withDeadlineAfter(10, TimeUnit.SECONDS);
        return UnknownFieldSet.parseFrom(
            ClientCalls.blockingUnaryCall(channel, descriptor, options, new byte[0]));
    }

    static String text(UnknownFieldSet message, int field) {
        if (!message.hasField(field)) {
            return "";
        }
        List<ByteString> values = message.getField(field).getLengthDelimitedList();
        return values.isEmpty() ? "" : values.get(0).toStringUtf8();
    }

    public static void main(String[] args) throws Exception {
        if (!Epoll.isAvailable()) {
            throw new IllegalStateException("netty's epoll transport is unavailable", Epoll.unavailabilityCause());
        }
        DomainSocketAddress socket = new DomainSocketAddress(args[0]);
        EpollEventLoopGroup group = new EpollEventLoopGroup(1);
        // Default settings: no overrideAuthority.
        ManagedChannel channel = NettyChannelBuilder.forAddress(socket)
            .eventLoopGroup(group)
            .channelType(EpollDomainSocketChannel.class)
            .usePlaintext()
            .build();
        int code = 0;
        try {
            System.out.println("authority=" + channel.authority());
            UnknownFieldSet info = call(channel, "csi.v1.Identity/GetPluginInfo");
            String name = text(info, 1);
            if (name.isEmpty()) {
                throw new IllegalStateException("GetPluginInfo: empty name");
            }
            System.out.println("GetPluginInfo name=" + name + " vendor_version=" + text(info, 2));

            UnknownFieldSet probe = call(channel, "csi.v1.Identity/Probe");
            String ready = "unset";
            if (probe.hasField(1)) {
                UnknownFieldSet wrapper = UnknownFieldSet.parseFrom(
                    probe.getField(1).getLengthDelimitedList().get(0));
                boolean value = wrapper.hasField(1) && wrapper.getField(1).getVarintList().get(0) != 0;
                if (!value) {
                    throw new IllegalStateException("Probe: ready=false");
                }
                ready = "true";
            }
            System.out.println("Probe ready=" + ready);

            UnknownFieldSet caps = call(channel, "csi.v1.Node/NodeGetCapabilities");
            int count = caps.hasField(1) ? caps.getField(1).getLengthDelimitedList().size() : 0;
            System.out.println("NodeGetCapabilities capabilities=" + count);
            System.out.println("grpc-java: ok");
        } catch (StatusRuntimeException e) {
            System.err.println("RPC failed: " + e.getStatus());
            code = 1;
        } finally {
            channel.shutdownNow().awaitTermination(5, TimeUnit.SECONDS);
            group.shutdownGracefully(0, 1, TimeUnit.SECONDS).await(5, TimeUnit.SECONDS);
        }
        System.exit(code);
    }
}
