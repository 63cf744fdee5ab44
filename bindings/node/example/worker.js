'use strict';
// A spool worker in Node.js: takes messages from a queue, handles each one and acks it,
// until SIGTERM or SIGINT (then it finishes the message in hand).
//
//   node example/worker.js [--work MS] [--idle S] QUEUE_DIR
//
// Handling here is a stand-in: it prints "processing PAYLOAD", waits --work ms, and prints
// "acked PAYLOAD" once the ack succeeded. Its leases are bound to the process, so if it is
// killed the message in hand is ready again at once for another worker (Go, C, Python,
// `spool work`).
const { Queue, LeaseLostError } = require('..');

async function main() {
  const args = process.argv.slice(2);
  let work = 0, idle = Infinity;
  while (args.length > 1 && args[0].startsWith('--')) {
    const [flag, value] = args.splice(0, 2);
    if (flag === '--work') work = Number(value);
    else if (flag === '--idle') idle = Number(value);
    else throw new Error(`unknown flag ${flag}`);
  }
  if (args.length !== 1) {
    console.error('usage: worker.js [--work MS] [--idle S] QUEUE_DIR');
    process.exit(2);
  }
  const q = await Queue.open(args[0]);
  q.bindLeases();
  let busy = false, stopping = false;
  const stop = () => {
    stopping = true;
    if (!busy) q.close(); // ends the loop's long poll within 100 ms
  };
  process.on('SIGTERM', stop);
  process.on('SIGINT', stop);
  for await (const m of q.messages({ wait: 1, idleTimeout: idle })) {
    busy = true;
    process.stdout.write(`processing ${m.text}\n`);
    await new Promise((resolve) => setTimeout(resolve, work));
    try {
      await m.ack();
      process.stdout.write(`acked ${m.text}\n`);
    } catch (e) {
      if (!(e instanceof LeaseLostError)) throw e;
      process.stdout.write(`lost ${m.text}\n`); // another worker has it now: drop the result
    }
    busy = false;
    if (stopping) break;
  }
  q.close();
}

main().catch((e) => {
  console.error('worker:', e.message);
  process.exit(1);
});
