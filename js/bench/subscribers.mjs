// One app's pages for js/bench/api.mjs's "subscribers" case: opens COUNT
// bare subscribers (hello, then subscribe, to GEM's events when given) on SOCKET, prints `ready` once
// each is answered, counts the events they read, and prints that count
// and the CPU time spent since `ready` (`{"events", "cpuSeconds"}`) and
// exits when its standard input ends. Run as
// `node subscribers.mjs SOCKET COUNT [GEM]`; the service's limits are per
// process, so the bench spreads its subscribers over several of these.

import net from 'node:net';

const [socket, countText, gem] = process.argv.slice(2);
const params = JSON.stringify(gem ? { gem } : {});
const count = Number(countText);
let events = 0;

function subscriber() {
  return new Promise((resolve, reject) => {
    const conn = net.createConnection(socket);
    let answered = false;
    let buffered = '';
    conn.setEncoding('utf8');
    conn.on('error', reject);
    conn.on('connect', () =>
      conn.write(`{"jsonrpc":"2.0","id":0,"method":"hello"}\n{"jsonrpc":"2.0","id":1,"method":"subscribe","params":${params}}\n`),
    );
    conn.on('data', (chunk) => {
      buffered += chunk;
      let at;
      while ((at = buffered.indexOf('\n')) >= 0) {
        const line = buffered.slice(0, at);
        buffered = buffered.slice(at + 1);
        if (!answered && line.includes('"id":1')) {
          answered = true;
          resolve(conn);
        } else if (line.includes('"method":"event"')) {
          events += 1;
        }
      }
    });
  });
}

const conns = [];
for (let i = 0; i < count; i++) conns.push(await subscriber());
// The CPU this process spends from now on is what reading the events
// costs the pages.
const cpuAtReady = process.cpuUsage();
process.stdout.write('ready\n');
process.stdin.resume();
process.stdin.on('end', () => {
  const cpu = process.cpuUsage(cpuAtReady);
  for (const c of conns) c.destroy();
  process.stdout.write(`${JSON.stringify({ events, cpuSeconds: (cpu.user + cpu.system) / 1e6 })}\n`);
  process.exit(0);
});
