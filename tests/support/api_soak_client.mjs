// One Node client of the API soak (tests/it/api_soak.rs): for `lifeMs` it
// connects to the store's service, subscribes to a gem, asks `path` for
// random resources (one or several at once), looks at `status`, now and
// then flips a blocklist of the origin's host on or off, and sometimes
// leaves in the middle of a call: closing its client, exiting (status 3)
// or killing itself (SIGKILL). When the service is gone it connects again.
//
// Every result is one JSON line on stdout, nothing else is written there:
//   {"kind": "connect", "ok": true, "pid": N}
//   {"kind": "path", "ok": true, "gem": "…", "id": "…", "path": "/…"}
//   {"kind": "path", "ok": false, "gem": "…", "id": "…", "code": "E_…", "primaryCause": "E_…"}
//   {"kind": "policy", "ok": true, "hosts": […], "stopped": N, "queued": N}
//   {"kind": "leave", "how": "exit" | "kill" | "close"}
//   {"kind": "done"}   (a process that ran its course, before its subscriptions end)
//
// With "view": true it only connects once and says what policy the service
// holds: {"kind": "view", "mode": "…", "hosts": […]}.
//
//   node api_soak_client.mjs '{"store": "/…/store", "seed": 7, "lifeMs": 5000,
//     "resources": [["alpha", "a0"], …], "gems": ["alpha", …],
//     "blockHost": "cdn.test", "leave": 0.04, "policy": 0.05}'

import { connect } from '../../js/index.js';

const settings = JSON.parse(process.argv[2]);
const end = Date.now() + settings.lifeMs;

/** mulberry32: the same seed gives the same choices. */
const random = (() => {
  let a = settings.seed >>> 0;
  return () => {
    a = (a + 0x6d2b79f5) >>> 0;
    let t = a;
    t = Math.imul(t ^ (t >>> 15), t | 1);
    t ^= t + Math.imul(t ^ (t >>> 7), t | 61);
    return ((t ^ (t >>> 14)) >>> 0) / 4294967296;
  };
})();

const pick = (items) => items[Math.floor(random() * items.length)];
const sleep = (ms) => new Promise((resolve) => setTimeout(resolve, ms));

/** Pipes are written synchronously on Linux: a line said is a line read, even before an exit. */
function say(fields) {
  process.stdout.write(JSON.stringify(fields) + '\n');
}

function failure(kind, error, fields = {}) {
  return {
    kind,
    ok: false,
    ...fields,
    code: error?.code ?? 'not a ResourceError',
    primaryCause: error?.primaryCause ?? null,
    message: String(error?.message ?? error).slice(0, 300),
  };
}

/** Whether `error` says the connection to the service is gone. */
const lost = (error) => error?.code === 'E_RESOURCE_SERVICE';

async function path(client, [gem, id]) {
  try {
    const answer = await client.path(gem, id);
    say({ kind: 'path', ok: true, gem, id, path: answer.path });
    return true;
  } catch (e) {
    say(failure('path', e, { gem, id }));
    return !lost(e);
  }
}

/** Several `path` calls at once on the one connection. */
async function paths(client) {
  const count = random() < 0.3 ? 2 + Math.floor(random() * 3) : 1;
  const calls = [];
  for (let i = 0; i < count; i++) calls.push(path(client, pick(settings.resources)));
  return (await Promise.all(calls)).every(Boolean);
}

async function flip(client) {
  const hosts = random() < 0.5 ? [settings.blockHost] : [];
  try {
    const change = await client.setPolicy({ mode: 'blocklist', hosts });
    say({ kind: 'policy', ok: true, hosts, stopped: change.stopped, queued: change.queued });
    return true;
  } catch (e) {
    say(failure('policy', e, { hosts }));
    return !lost(e);
  }
}

async function status(client) {
  try {
    const answer = await client.status();
    say({ kind: 'status', ok: true, gems: answer.gems.length });
    return true;
  } catch (e) {
    say(failure('status', e));
    return !lost(e);
  }
}

/** Leaves in the middle of a `path` call: closes the client, exits or kills this process. */
async function leave(client) {
  const how = pick(['close', 'close', 'exit', 'kill']);
  const call = path(client, pick(settings.resources));
  await sleep(random() * 200);
  say({ kind: 'leave', how });
  if (how === 'exit') process.exit(3);
  if (how === 'kill') process.kill(process.pid, 'SIGKILL');
  client.close();
  await call;
  return false;
}

async function subscribe(client, gem) {
  let sub;
  try {
    sub = await client.subscribe({ gem });
    say({ kind: 'subscribe', ok: true, gem, rows: sub.status.length });
  } catch (e) {
    say(failure('subscribe', e, { gem }));
    return;
  }
  (async () => {
    let ended = null;
    let seen = 0;
    try {
      for await (const event of sub) {
        if (event && typeof event.event === 'string') seen += 1;
      }
    } catch (e) {
      ended = e?.code ?? String(e);
    }
    say({ kind: 'subscription', gem, events: seen, ended });
  })();
}

/** One connection's calls, until it is lost, the life ends, or a few were made. */
async function session(client) {
  if (random() < 0.7) await subscribe(client, pick(settings.gems));
  const calls = 1 + Math.floor(random() * 10);
  for (let i = 0; i < calls && Date.now() < end; i++) {
    const r = random();
    let alive;
    if (r < settings.leave) alive = await leave(client);
    else if (r < settings.leave + settings.policy) alive = await flip(client);
    else if (r < 0.85) alive = await paths(client);
    else alive = await status(client);
    if (!alive) return;
    await sleep(random() * 150);
  }
}

async function main() {
  while (Date.now() < end) {
    let client;
    try {
      client = await connect({ store: settings.store });
      say({ kind: 'connect', ok: true, pid: client.service.pid });
    } catch (e) {
      say(failure('connect', e));
      await sleep(100 + random() * 300);
      continue;
    }
    try {
      await session(client);
    } finally {
      client.close();
    }
  }
  say({ kind: 'done' });
}

/** Connects once and says the service's policy. */
async function view() {
  const client = await connect({ store: settings.store });
  try {
    const policy = await client.policy();
    say({ kind: 'view', mode: policy.mode, hosts: policy.hosts });
  } finally {
    client.close();
  }
}

(settings.view ? view() : main()).catch((e) => {
  process.stderr.write(`api_soak_client: ${e?.stack ?? e}\n`);
  process.exit(1);
});
