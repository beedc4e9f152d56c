// Calls a CSI endpoint with @grpc/grpc-js's default channel settings.
//
// Usage: NODE_PATH=<dir>/node_modules node node_client.js unix:///path/csi.sock path/to/csi.proto
//
// Prints one line per call and exits non-zero on the first failure.
'use strict';

const grpc = require('@grpc/grpc-js');
const protoLoader = require('@grpc/proto-loader');

const [target, protoPath] = process.argv.slice(2);

function call(client, method) {
  return new Promise((resolve, reject) => {
    const deadline = new Date(Date.now() + 10000);
    client[method]({}, { deadline }, (err, response) => (err ? reject(err) : resolve(response)));
  });
}

async function main() {
  const definition = protoLoader.loadSync(protoPath, { keepCase: true, defaults: false });
  const csi = grpc.loadPackageDefinition(definition).csi.v1;
  const credentials = grpc.credentials.createInsecure();
  const identity = new csi.Identity(target, credentials);
  const node = new csi.Node(target, credentials);

  const info = await call(identity, 'GetPluginInfo');
  if (!info.name) throw new Error('GetPluginInfo: empty name');
  console.log(`GetPluginInfo name=${info.name} vendor_version=${info.vendor_version}`);

  const probe = await call(identity, 'Probe');
  if (probe.ready && probe.ready.value === false) throw new Error('Probe: ready=false');
  console.log(`Probe ready=${probe.ready ? probe.ready.value : 'unset'}`);

  const caps = await call(node, 'NodeGetCapabilities');
  console.log(`NodeGetCapabilities capabilities=${caps.capabilities.length}`);

  identity.close();
  node.close();
  console.log(`grpc-js ${require('@grpc/grpc-js/package.json').version}: ok`);
}

main().catch((err) => {
  console.error(`RPC failed: ${err.message}`);
  process.exit(1);
});
