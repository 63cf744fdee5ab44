'use strict';
// The Node side of bench/bench_bindings.sh: `await q.send(payload)` and
// `await q.sendBatch(100 payloads)` (64 bytes each, a fresh queue each, the default interval
// sync policy). Usage: node bench_node.js PACKAGE_DIR DIR N. Prints as bench_capi does
// (wall and CPU time per call).
const path = require('path');
const [pkg, dir, nArg] = process.argv.slice(2);
const { Queue } = require(path.resolve(pkg));
const n = Number(nArg);

const cpuNs = () => { const u = process.cpuUsage(); return (u.user + u.system) * 1000; };

async function main() {
  const payload = Buffer.alloc(64, 'x');
  let q = await Queue.create(path.join(dir, 'node-send'), { segmentSize: 256 << 20 });
  let t0 = process.hrtime.bigint(), c0 = cpuNs();
  for (let i = 0; i < n; i++) await q.send(payload);
  console.log(`send_ns ${Number(process.hrtime.bigint() - t0) / n}`);
  console.log(`send_cpu_ns ${(cpuNs() - c0) / n}`);
  q.close();

  const batch = Array.from({ length: 100 }, () => payload);
  q = await Queue.create(path.join(dir, 'node-batch'), { segmentSize: 256 << 20 });
  const calls = Math.max(1, Math.floor(n / 100));
  t0 = process.hrtime.bigint();
  c0 = cpuNs();
  for (let i = 0; i < calls; i++) await q.sendBatch(batch);
  console.log(`batch100_ns ${Number(process.hrtime.bigint() - t0) / calls}`);
  console.log(`batch100_cpu_ns ${(cpuNs() - c0) / calls}`);
  q.close();
}
main().catch((e) => { console.error(e); process.exit(1); });
