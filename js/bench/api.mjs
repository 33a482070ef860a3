// The local API's figures (BENCHMARKS.md, "The local API"), each printed as
// a Markdown table row with the command that reproduces it. The cases
// (BENCH_API_CASES, all by default, in this order):
//
//   path        `path` of a present 64 KiB file from Node: BENCH_API_CALLS
//               sequential calls on one connection, p50 and p99 (target:
//               p50 < 0.5 ms); also the first call on the present file. The
//               same in a gem of BENCH_API_BIG_GEM present 256-byte files
//               (the calls go round its resources): the cost grows with the
//               gem.
//   cli         the same `path` by starting the command line per call
//               (BENCH_API_CLI_CALLS), through the service and in its own
//               process (--no-service).
//   progress    the cost of a call's own progress: one BENCH_API_PROGRESS_MIB
//               file fetched by `path(gem, id)` alone, by `path(gem, id,
//               {onProgress})` and by `for await (… of pull(gem, id))`, each
//               on a fresh store with its own fresh service, all from the
//               same origin; BENCH_API_PROGRESS_RUNS rounds, the three
//               interleaved (their order rotates each round), medians. The
//               overhead is median(with progress) / median(path alone) - 1,
//               and the median of the per-round ratios (target: < 2 %).
//   concurrent  1000 (BENCH_API_CONCURRENT) `path` calls at once on one
//               connection (one Client, Promise.all), per run
//               (BENCH_API_CONCURRENT_RUNS, medians): the calls spread over
//               BENCH_API_CONCURRENT_FILES files of BENCH_API_CONCURRENT_KIB
//               missing at first (one download per file, many waiters),
//               then the same again once present; and one call for each of
//               1000 distinct 256-byte files, missing, then present. Each: the
//               total time, p50 and p99 per call (from its send to its
//               answer), whether every call resolved to its own file (gem,
//               resource, one path per file, the file's size; the SHA-256 of
//               each file downloaded), and the origin's GETs per file.
//   subscribers one BENCH_API_MIB download with 0 and with
//               BENCH_API_SUBSCRIBERS subscribers on the service
//               (BENCH_API_RUNS interleaved runs): its time and the
//               service's memory and CPU time; the subscribers live in
//               processes of js/bench/subscribers.mjs, 200 each.
//
// Always: the memory of an idle service with the API open, and the load
// average at the start and the end (the figures of a busy machine are upper
// bounds).
//
//   GEM_RESOURCES_BIN=target/release/gem-resources node js/bench/api.mjs
//   BENCH_API_CASES="progress concurrent" node js/bench/api.mjs
//   BENCH_CASES=api scripts/bench.sh           # the same, from the bench
//
// Knobs (environment): GEM_RESOURCES_BIN (default target/release/
// gem-resources), BENCH_API_CASES ("path cli progress concurrent
// subscribers"), BENCH_API_CALLS (2000), BENCH_API_BIG_GEM (1000),
// BENCH_API_CLI_CALLS (100), BENCH_API_PROGRESS_MIB (64),
// BENCH_API_PROGRESS_RUNS (11),
// BENCH_API_CONCURRENT (1000), BENCH_API_CONCURRENT_FILES (10),
// BENCH_API_CONCURRENT_KIB (1024), BENCH_API_CONCURRENT_RUNS (5),
// BENCH_API_SUBSCRIBERS (1000), BENCH_API_MIB (256), BENCH_API_RUNS (3),
// BENCH_API_SUBSCRIBE (all: every gem's events; own: the downloaded gem's;
// other: another gem's), BENCH_API_SUBSCRIBERS_NICE (0).
//
// Everything runs on 127.0.0.1: the test fixture's HTTPS origin
// (js/test/fixture.js, served by this Node process) and real `gem-resources
// serve` processes on stores under the temporary folder (TMPDIR). Details
// of each run go to stdout as they come; the table comes last.

import crypto from 'node:crypto';
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { spawn } from 'node:child_process';
import { fileURLToPath } from 'node:url';

const here = path.dirname(fileURLToPath(import.meta.url));
const repoRoot = path.resolve(here, '..', '..');
// The fixture reads GEM_RESOURCES_BIN when loaded (and defaults to the debug
// build): measure the release build unless told otherwise.
process.env.GEM_RESOURCES_BIN ??= path.join(repoRoot, 'target', 'release', 'gem-resources');
const { Fixture, binary } = await import('../test/fixture.js');

const knob = (name, fallback) => Number(process.env[name] ?? fallback);
const CASES = (process.env.BENCH_API_CASES ?? 'path cli progress concurrent subscribers').split(/[\s,]+/).filter(Boolean);
const CALLS = knob('BENCH_API_CALLS', 2000);
const BIG_GEM = knob('BENCH_API_BIG_GEM', 1000);
const CLI_CALLS = knob('BENCH_API_CLI_CALLS', 100);
const PROGRESS_MIB = knob('BENCH_API_PROGRESS_MIB', 64);
const PROGRESS_RUNS = knob('BENCH_API_PROGRESS_RUNS', 11);
const CONCURRENT = knob('BENCH_API_CONCURRENT', 1000);
const CONCURRENT_FILES = knob('BENCH_API_CONCURRENT_FILES', 10);
const CONCURRENT_KIB = knob('BENCH_API_CONCURRENT_KIB', 1024);
const CONCURRENT_RUNS = knob('BENCH_API_CONCURRENT_RUNS', 5);
const SUBSCRIBERS = knob('BENCH_API_SUBSCRIBERS', 1000);
const MIB = knob('BENCH_API_MIB', 256);
const RUNS = knob('BENCH_API_RUNS', 3);
// Which gem the subscribers follow: every gem (`{}`, as a log or a window
// of every gem's pages does), the gem being downloaded (`{gem}`, a page of
// that gem), or another gem (a page of a gem with nothing going on).
const SUBSCRIBE = process.env.BENCH_API_SUBSCRIBE ?? 'all';
// The subscribers' processes' niceness: 19 shows what the service itself
// adds, their own reading then yielding the CPU to the download.
const SUBSCRIBERS_NICE = knob('BENCH_API_SUBSCRIBERS_NICE', 0);

const cleanups = [];
const t = { after: (fn) => cleanups.push(fn) };

// --- figures ------------------------------------------------------------

function quantile(samples, q) {
  const sorted = [...samples].sort((a, b) => a - b);
  return sorted[Math.min(sorted.length - 1, Math.floor(q * sorted.length))];
}

const median = (xs) => quantile(xs, 0.5);
const now = () => process.hrtime.bigint();
/** Nanoseconds since `start` (a `now()`). */
const since = (start) => Number(now() - start);
/** Nanoseconds as milliseconds, 3 decimals. */
const ms = (ns) => (ns / 1e6).toFixed(3);
const secs = (ns) => (ns / 1e9).toFixed(3);
const pct = (ratio) => `${ratio >= 1 ? '+' : ''}${((ratio - 1) * 100).toFixed(1)} %`;
const spread = (xs, fmt, to = '–') => `${fmt(Math.min(...xs))}${to}${fmt(Math.max(...xs))}`;

function memory(pid) {
  const status = fs.readFileSync(`/proc/${pid}/status`, 'utf8');
  const kib = (key) => Number(status.match(new RegExp(`${key}:\\s+(\\d+)`))[1]);
  return { rss: kib('VmRSS'), peak: kib('VmHWM') };
}

/** The CPU time (user + system, seconds) process `pid` has used so far. */
function cpuSeconds(pid) {
  const stat = fs.readFileSync(`/proc/${pid}/stat`, 'utf8');
  const fields = stat.slice(stat.lastIndexOf(')') + 2).split(' ');
  // utime and stime, fields 14 and 15 of the whole line, in clock ticks (100 per second here).
  return (Number(fields[11]) + Number(fields[12])) / 100;
}

const loadavg = () => os.loadavg().map((x) => x.toFixed(2)).join(' ');

// --- the table ----------------------------------------------------------

const rows = [];
const shownBinary = path.relative(process.cwd(), binary).startsWith('..') ? binary : path.relative(process.cwd(), binary);

/** The command that reproduces a row: the binary, the case's knobs, the script. */
function command(knobs = {}) {
  const env = [`GEM_RESOURCES_BIN=${shownBinary}`];
  for (const [key, value] of Object.entries(knobs)) env.push(`${key}=${/\s/.test(String(value)) ? `"${value}"` : value}`);
  return `\`${env.join(' ')} node ${path.relative(process.cwd(), fileURLToPath(import.meta.url))}\``;
}

function row(figure, result, target, knobs) {
  rows.push(`| ${figure} | ${result} | ${target} | ${command(knobs)} |`);
}

function say(line) {
  console.log(line);
}

// --- helpers --------------------------------------------------------------

/**
 * Installs `gem` through the API only. Not `ctx.installGem`, which also
 * writes the manifest into the gems folder that `serve` watches: there the
 * service installs the gem again after every `uninstall`, and the gems the
 * runs leave behind would pile up (and slow `status`, `subscribe`, …).
 */
function install(ctx, client, gem, resources) {
  return client.install(gem, ctx.manifest(gem, resources));
}

/**
 * Runs the command line and resolves with `{status, stderr}` when it exits.
 * Not spawnSync: this process reads the service's stdout (its events), and
 * a service whose stdout is not read stops answering once the pipe is full
 * (a CLI call then waits 5 s for `hello` and works in process).
 */
function runCli(args) {
  return new Promise((resolve, reject) => {
    const child = spawn(binary, args, { stdio: ['ignore', 'ignore', 'pipe'] });
    let stderr = '';
    child.stderr.setEncoding('utf8').on('data', (d) => (stderr += d));
    child.on('error', reject);
    child.on('close', (status) => resolve({ status, stderr }));
  });
}

/** Subscribers of one app per process (the service's limits are per process). */
const SUBSCRIBERS_PER_PROCESS = 200;

/**
 * `count` bare subscribers (hello, subscribe), spread over `processes`
 * processes of js/bench/subscribers.mjs as the pages of several apps are;
 * resolves once every one is answered, to `{stop()}`, which resolves to the
 * events they read and the CPU seconds their processes spent from `ready` on
 * (`{events, cpuSeconds}`). With `count` 0 the processes start and open
 * nothing: starting a process slows this one (the origin's) for a while
 * after, so the runs without subscribers start as many.
 */
async function subscribers(socket, count, gem, processes) {
  const children = [];
  for (let i = 0; i < processes; i++) {
    const n = Math.floor(count / processes) + (i < count % processes ? 1 : 0);
    const args = [path.join(here, 'subscribers.mjs'), socket, String(n), ...(gem ? [gem] : [])];
    const child = spawn(process.execPath, args, { stdio: ['pipe', 'pipe', 'inherit'] });
    if (SUBSCRIBERS_NICE) os.setPriority(child.pid, SUBSCRIBERS_NICE);
    let out = '';
    child.stdout.setEncoding('utf8');
    const ready = new Promise((resolve, reject) => {
      child.stdout.on('data', (chunk) => {
        out += chunk;
        if (out.startsWith('ready\n')) resolve();
      });
      child.on('close', (status) => reject(new Error(`subscribers.mjs ended (${status}) before it was ready`)));
    });
    const ended = new Promise((resolve) =>
      child.on('close', () => {
        try {
          resolve(JSON.parse(out.slice('ready\n'.length)));
        } catch {
          resolve({ events: 0, cpuSeconds: 0 });
        }
      }),
    );
    children.push({ child, ready, ended });
  }
  await Promise.all(children.map((c) => c.ready));
  return {
    async stop() {
      for (const c of children) c.child.stdin.end();
      const ends = await Promise.all(children.map((c) => c.ended));
      return {
        events: ends.reduce((a, e) => a + e.events, 0),
        cpuSeconds: ends.reduce((a, e) => a + e.cpuSeconds, 0),
      };
    },
  };
}

/**
 * A fresh store with its own `gem-resources serve` and one client, fed by
 * `origin` (an Origin that listens: the same files and port for every
 * store). `close()` stops the service and removes the store, not the origin.
 */
async function freshStore(origin) {
  const store = new Fixture({});
  store.origin = origin;
  store.writeConfig();
  let closed = false;
  const close = async () => {
    if (closed) return;
    closed = true;
    for (const client of store.clients) client.close();
    if (store.service) await store.service.stop(5000);
    fs.rmSync(store.dir, { recursive: true, force: true, maxRetries: 3 });
  };
  cleanups.push(close);
  await store.startService();
  const client = await store.connect();
  return { store, client, close };
}

/**
 * `ids.length` `path` calls of `gem` sent at once on `client`'s one
 * connection: `{total, per, results}` (nanoseconds; per call from its send
 * to its answer; `results` as Promise.allSettled gives them).
 */
async function burst(client, gem, ids) {
  const per = new Array(ids.length);
  const start = now();
  const calls = ids.map((id, i) => {
    const sent = now();
    return client.path(gem, id).then((r) => {
      per[i] = since(sent);
      return r;
    });
  });
  const results = await Promise.allSettled(calls);
  return { total: since(start), per: per.filter((x) => x !== undefined), results };
}

/**
 * Problems with a burst's answers (none: []): every call answered, for its
 * own gem and resource, one path per resource, holding the file's bytes
 * (`files`: id -> origin file; `hash`: also compare the SHA-256).
 */
function checkBurst(gem, ids, results, files, { hash }) {
  const problems = [];
  const paths = new Map();
  results.forEach((r, i) => {
    const id = ids[i];
    if (r.status !== 'fulfilled') {
      problems.push(`${id}: ${r.reason?.code ?? ''} ${r.reason?.message ?? r.reason}`);
      return;
    }
    const { value } = r;
    if (value.gem !== gem || value.resource !== id) problems.push(`${id}: answered for ${value.gem}/${value.resource}`);
    const seen = paths.get(id);
    if (seen === undefined) paths.set(id, value.path);
    else if (seen !== value.path) problems.push(`${id}: two paths, ${seen} and ${value.path}`);
  });
  for (const [id, p] of paths) {
    const file = files.get(id);
    const st = fs.statSync(p, { throwIfNoEntry: false });
    if (!st || st.size !== file.size) problems.push(`${id}: ${p} has ${st ? st.size : 'no'} bytes, not ${file.size}`);
    else if (hash && crypto.createHash('sha256').update(fs.readFileSync(p)).digest('hex') !== file.sha256) problems.push(`${id}: ${p} does not hold its bytes`);
  }
  return problems;
}

// --- the cases ------------------------------------------------------------

let small = null;

/** The 64 KiB file of gem `p`, resource `small`, present; the time of the call that downloaded it. */
async function presentSmall(ctx, client) {
  if (small) return small;
  const file = ctx.origin.add('small.bin', { size: 64 * 1024 });
  await install(ctx, client, 'p', [ctx.resource(file, { id: 'small' })]);
  const start = now();
  await client.path('p', 'small');
  small = { file, download: since(start) };
  return small;
}

async function casePath(ctx, client) {
  const { download } = await presentSmall(ctx, client);
  const before = memory(ctx.service.pid);
  const api = [];
  for (let i = 0; i < CALLS; i++) {
    const start = now();
    await client.path('p', 'small');
    api.push(since(start));
  }
  const after = memory(ctx.service.pid);
  const p50 = quantile(api, 0.5);
  say(`path over the API from Node (${CALLS} sequential calls, one connection): p50 ${ms(p50)} ms, p99 ${ms(quantile(api, 0.99))} ms, max ${ms(Math.max(...api))} ms; first call ${ms(api[0])} ms (the call that downloaded the file: ${ms(download)} ms); service RSS ${before.rss} -> ${after.rss} KiB`);
  row(
    `\`path\` of a present 64 KiB file from Node, ${CALLS} sequential calls, one connection`,
    `p50 ${ms(p50)} ms, p99 ${ms(quantile(api, 0.99))} ms (first ${ms(api[0])}, max ${ms(Math.max(...api))}); service RSS ${before.rss} → ${after.rss} KiB`,
    `p50 < 0.5 ms: ${p50 < 0.5e6 ? 'met' : 'NOT met'}`,
    { BENCH_API_CASES: 'path', BENCH_API_CALLS: CALLS, BENCH_API_BIG_GEM: BIG_GEM },
  );

  // The same in a gem of many resources.
  const files = Array.from({ length: BIG_GEM }, (_, i) => ctx.origin.add(`pbig-${i}.bin`, { size: 256 }));
  await install(ctx, client, 'pbig', files.map((f, i) => ctx.resource(f, { id: `r${i}` })));
  await Promise.all(files.map((_, i) => client.path('pbig', `r${i}`)));
  const big = [];
  for (let i = 0; i < CALLS; i++) {
    const start = now();
    await client.path('pbig', `r${i % BIG_GEM}`);
    big.push(since(start));
  }
  await client.uninstall('pbig');
  for (const f of files) ctx.origin.files.delete(f.name);
  const p50big = quantile(big, 0.5);
  say(`path over the API from Node in a gem of ${BIG_GEM} resources (${CALLS} sequential calls): p50 ${ms(p50big)} ms, p99 ${ms(quantile(big, 0.99))} ms, max ${ms(Math.max(...big))} ms`);
  row(
    `the same in a gem of ${BIG_GEM} present 256 B files (the calls go round them)`,
    `p50 ${ms(p50big)} ms, p99 ${ms(quantile(big, 0.99))} ms (max ${ms(Math.max(...big))})`,
    `p50 < 0.5 ms: ${p50big < 0.5e6 ? 'met' : 'NOT met'}`,
    { BENCH_API_CASES: 'path', BENCH_API_CALLS: CALLS, BENCH_API_BIG_GEM: BIG_GEM },
  );
}

async function caseCli(ctx, client) {
  await presentSmall(ctx, client);
  for (const [label, extra] of [['through the service', []], ['in its own process (`--no-service`)', ['--no-service']]]) {
    const cli = [];
    let inProcess = 0;
    for (let i = 0; i < CLI_CALLS; i++) {
      const start = now();
      const out = await runCli([...ctx.baseArgs(), ...extra, 'path', 'p', 'small']);
      cli.push(since(start));
      if (out.status !== 0) throw new Error(`path failed: ${out.stderr}`);
      if (extra.length === 0 && out.stderr.includes('not using the store')) inProcess += 1;
    }
    const fellBack = inProcess ? ` (${inProcess} calls did not reach the service and worked in process)` : '';
    say(`path by starting the CLI per call, ${label} (${CLI_CALLS} calls): p50 ${ms(quantile(cli, 0.5))} ms, p99 ${ms(quantile(cli, 0.99))} ms${fellBack}`);
    row(
      `\`gem-resources path\` started per call, ${label}, ${CLI_CALLS} calls`,
      `p50 ${ms(quantile(cli, 0.5))} ms, p99 ${ms(quantile(cli, 0.99))} ms${fellBack}`,
      '–',
      { BENCH_API_CASES: 'cli', BENCH_API_CLI_CALLS: CLI_CALLS },
    );
  }
}

/** The three ways to fetch one file, each resolving to its path and the events it saw. */
const FETCHES = {
  path: async (client, gem, id) => ({ path: (await client.path(gem, id)).path, events: 0 }),
  onProgress: async (client, gem, id) => {
    let events = 0;
    const r = await client.path(gem, id, { onProgress: () => (events += 1) });
    return { path: r.path, events };
  },
  pull: async (client, gem, id) => {
    let events = 0;
    let got;
    for await (const e of client.pull(gem, id)) {
      if (e.event === 'path') got = e.path;
      else events += 1;
    }
    return { path: got, events };
  },
};
const FETCH_LABELS = {
  path: '`path(gem, id)`',
  onProgress: '`path(gem, id, {onProgress})`',
  pull: '`for await (… of pull(gem, id))`',
};

async function caseProgress(ctx) {
  const file = ctx.origin.add('progress.bin', { size: PROGRESS_MIB * 1024 * 1024 });
  const ways = Object.keys(FETCHES);
  const times = Object.fromEntries(ways.map((w) => [w, []]));
  const events = Object.fromEntries(ways.map((w) => [w, []]));
  for (let round = 0; round < PROGRESS_RUNS; round++) {
    const order = ways.map((_, i) => ways[(i + round) % ways.length]);
    const line = [];
    for (const way of order) {
      const { store, client, close } = await freshStore(ctx.origin);
      await install(store, client, 'g', [store.resource(file, { id: 'big' })]);
      const start = now();
      const got = await FETCHES[way](client, 'g', 'big');
      const took = since(start);
      const size = got.path && fs.statSync(got.path, { throwIfNoEntry: false })?.size;
      if (size !== file.size) throw new Error(`${way}: the path ${got.path} has ${size} bytes, not ${file.size}`);
      times[way].push(took);
      events[way].push(got.events);
      line.push(`${way} ${secs(took)} s${way === 'path' ? '' : ` (${got.events} events)`}`);
      await close();
    }
    say(`  progress round ${round + 1}: ${line.join(', ')}`);
  }
  const base = median(times.path);
  say(`${PROGRESS_MIB} MiB, a fresh store per fetch, medians of ${PROGRESS_RUNS}: ${ways.map((w) => `${w} ${secs(median(times[w]))} s`).join(', ')}`);
  const knobs = { BENCH_API_CASES: 'progress', BENCH_API_PROGRESS_MIB: PROGRESS_MIB, BENCH_API_PROGRESS_RUNS: PROGRESS_RUNS };
  row(
    `${FETCH_LABELS.path} of a missing ${PROGRESS_MIB} MiB file, fresh store, ${PROGRESS_RUNS} runs`,
    `median ${secs(base)} s (${(PROGRESS_MIB / (base / 1e9)).toFixed(0)} MiB/s), spread ${spread(times.path, secs)}`,
    '–',
    knobs,
  );
  for (const way of ['onProgress', 'pull']) {
    const m = median(times[way]);
    const paired = times[way].map((x, i) => x / times.path[i]);
    say(`  ${way} ÷ path per round: ${paired.map((r) => r.toFixed(3)).join(', ')}`);
    row(
      `${FETCH_LABELS[way]} of the same, interleaved with it`,
      `median ${secs(m)} s, spread ${spread(times[way], secs)}, ${median(events[way])} events: overhead ${pct(m / base)} (medians), ${pct(median(paired))} (median of the per-round ratios, ${spread(paired, pct, ' to ')})`,
      '< 2 %',
      knobs,
    );
  }
}

async function caseConcurrent(ctx, client) {
  const pid = ctx.service.pid;
  const N = CONCURRENT;
  const shapes = {
    fewMissing: { label: `${N} calls over ${CONCURRENT_FILES} files of ${CONCURRENT_KIB} KiB, missing at first (one download per file, ${Math.ceil(N / CONCURRENT_FILES)} waiters each)` },
    fewPresent: { label: `${N} calls over the same ${CONCURRENT_FILES} files, present` },
    manyMissing: { label: `${N} calls, one per file, ${N} files of 256 B missing at first` },
    manyPresent: { label: `${N} calls, one per file, the same ${N} files, present` },
  };
  for (const s of Object.values(shapes)) Object.assign(s, { totals: [], p50s: [], p99s: [], ok: 0, calls: 0, problems: [], gets: [] });
  const rss = [memory(pid).rss];

  const record = (shape, gem, ids, files, b, { hash, downloads }) => {
    const problems = checkBurst(gem, ids, b.results, files, { hash });
    const s = shapes[shape];
    s.totals.push(b.total);
    s.p50s.push(quantile(b.per, 0.5));
    s.p99s.push(quantile(b.per, 0.99));
    s.calls += ids.length;
    s.ok += b.results.filter((r) => r.status === 'fulfilled').length;
    s.problems.push(...problems);
    if (downloads) for (const f of files.values()) s.gets.push(ctx.origin.requestCount(f.name));
    return `${shape} ${secs(b.total)} s (p50 ${ms(quantile(b.per, 0.5))}, p99 ${ms(quantile(b.per, 0.99))} ms${problems.length ? `, ${problems.length} PROBLEMS` : ''})`;
  };

  for (let run = 0; run < CONCURRENT_RUNS; run++) {
    const line = [];
    // A few files, many waiters each: new bytes each run, so every run downloads.
    const few = new Map();
    for (let i = 0; i < CONCURRENT_FILES; i++) few.set(`f${i}`, ctx.origin.add(`c${run}-f${i}.bin`, { size: CONCURRENT_KIB * 1024 }));
    const fewGem = `cf${run}`;
    await install(ctx, client, fewGem, [...few].map(([id, f]) => ctx.resource(f, { id })));
    const fewIds = Array.from({ length: N }, (_, i) => `f${i % CONCURRENT_FILES}`);
    line.push(record('fewMissing', fewGem, fewIds, few, await burst(client, fewGem, fewIds), { hash: true, downloads: true }));
    line.push(record('fewPresent', fewGem, fewIds, few, await burst(client, fewGem, fewIds), { hash: false }));
    // One file per call.
    const many = new Map();
    for (let i = 0; i < N; i++) many.set(`m${i}`, ctx.origin.add(`c${run}-m${i}.bin`, { size: 256 }));
    const manyGem = `cm${run}`;
    await install(ctx, client, manyGem, [...many].map(([id, f]) => ctx.resource(f, { id })));
    const manyIds = [...many.keys()];
    line.push(record('manyMissing', manyGem, manyIds, many, await burst(client, manyGem, manyIds), { hash: true, downloads: true }));
    line.push(record('manyPresent', manyGem, manyIds, many, await burst(client, manyGem, manyIds), { hash: false }));
    rss.push(memory(pid).rss);
    await client.uninstall(fewGem);
    await client.uninstall(manyGem);
    for (const f of [...few.values(), ...many.values()]) ctx.origin.files.delete(f.name);
    say(`  concurrent run ${run + 1}: ${line.join('; ')}; service RSS ${rss.at(-1)} KiB`);
  }
  const peak = memory(pid).peak;
  say(`service RSS over the concurrent runs: ${rss.join(' -> ')} KiB (peak ${peak} KiB)`);
  const knobs = {
    BENCH_API_CASES: 'concurrent',
    BENCH_API_CONCURRENT: N,
    BENCH_API_CONCURRENT_FILES: CONCURRENT_FILES,
    BENCH_API_CONCURRENT_KIB: CONCURRENT_KIB,
    BENCH_API_CONCURRENT_RUNS: CONCURRENT_RUNS,
  };
  for (const [name, s] of Object.entries(shapes)) {
    const correct = s.problems.length === 0 && s.ok === s.calls ? `all ${s.calls} resolved correctly` : `${s.ok} of ${s.calls} resolved, ${s.problems.length} problems (first: ${s.problems[0] ?? 'a rejection'})`;
    const gets = s.gets.length ? `; GETs per file ${Math.min(...s.gets)}${Math.max(...s.gets) !== Math.min(...s.gets) ? `–${Math.max(...s.gets)}` : ''}` : '';
    const memo = name === 'manyPresent' ? `; service RSS ${rss[0]} → ${rss.at(-1)} KiB over the runs (peak ${peak})` : '';
    if (s.problems.length) say(`  ${name} problems: ${s.problems.slice(0, 5).join('; ')}`);
    row(
      `\`Promise.all\` of ${s.label}, one Client, ${CONCURRENT_RUNS} runs`,
      `total ${ms(median(s.totals))} ms (spread ${spread(s.totals, ms)}), per call p50 ${ms(median(s.p50s))} ms, p99 ${ms(median(s.p99s))} ms (medians over the runs); ${correct}${gets}${memo}`,
      '–',
      knobs,
    );
  }
}

async function download(ctx, client, gem, file) {
  await install(ctx, client, gem, [ctx.resource(file, { id: 'big' })]);
  const start = now();
  await client.path(gem, 'big');
  return since(start) / 1e9;
}

async function caseSubscribers(ctx, client) {
  const pid = ctx.service.pid;
  const big = ctx.origin.add('big.bin', { size: MIB * 1024 * 1024 });
  const times = { 0: [], [SUBSCRIBERS]: [] };
  // The service's own CPU time for the download: what the subscribers cost
  // it, whatever else the machine runs.
  const cpu = { 0: [], [SUBSCRIBERS]: [] };
  const rss = [];
  // The CPU the subscribers' own processes spend meanwhile: on a machine
  // with few cores, it is taken from the download.
  const pagesCpu = [];
  for (let run = 0; run < RUNS; run++) {
    // Which goes first alternates, so neither has the other's leftovers
    // (the page cache, a deletion) more often.
    for (const count of run % 2 === 0 ? [0, SUBSCRIBERS] : [SUBSCRIBERS, 0]) {
      const gem = `d${run}-${count}`;
      const followed = { all: null, own: gem, other: 'a-gem-with-nothing-going-on' }[SUBSCRIBE];
      if (followed === undefined) throw new Error(`BENCH_API_SUBSCRIBE must be all, own or other, not ${SUBSCRIBE}`);
      const pages = await subscribers(ctx.service.socket, count, followed, Math.ceil(SUBSCRIBERS / SUBSCRIBERS_PER_PROCESS));
      const cpuBefore = cpuSeconds(pid);
      times[count].push(await download(ctx, client, gem, big));
      cpu[count].push(cpuSeconds(pid) - cpuBefore);
      const mem = memory(pid);
      const read = await pages.stop();
      if (count > 0) {
        rss.push(mem.rss);
        pagesCpu.push(read.cpuSeconds);
        say(`  run ${run + 1}: ${count} subscribers in ${Math.ceil(count / SUBSCRIBERS_PER_PROCESS)} processes, RSS ${mem.rss} KiB (peak ${mem.peak} KiB), ${read.events} events delivered; the subscribers' processes spent ${read.cpuSeconds.toFixed(2)} s of CPU reading them`);
      }
      await client.uninstall(gem);
    }
  }
  const knobs = { BENCH_API_CASES: 'subscribers', BENCH_API_MIB: MIB, BENCH_API_SUBSCRIBERS: SUBSCRIBERS, BENCH_API_RUNS: RUNS, BENCH_API_SUBSCRIBE: SUBSCRIBE, BENCH_API_SUBSCRIBERS_NICE: SUBSCRIBERS_NICE };
  for (const count of [0, SUBSCRIBERS]) {
    const s = median(times[count]);
    say(`download of ${MIB} MiB with ${count} subscribers: median ${s.toFixed(2)} s (${(MIB / s).toFixed(0)} MiB/s) of ${times[count].map((x) => x.toFixed(2)).join(', ')}; the service's CPU ${median(cpu[count]).toFixed(2)} s (median of ${cpu[count].map((x) => x.toFixed(2)).join(', ')})`);
  }
  const ratio = median(times[SUBSCRIBERS]) / median(times[0]);
  row(
    `download of ${MIB} MiB with ${SUBSCRIBERS} subscribers (following ${SUBSCRIBE === 'all' ? 'every gem' : SUBSCRIBE === 'own' ? 'its gem' : 'another gem'}${SUBSCRIBERS_NICE ? `, niceness ${SUBSCRIBERS_NICE}` : ''}) against none, ${RUNS} interleaved runs`,
    `median ${median(times[SUBSCRIBERS]).toFixed(2)} s against ${median(times[0]).toFixed(2)} s (${ratio.toFixed(3)}×; spreads ${spread(times[SUBSCRIBERS], (x) => x.toFixed(2))} and ${spread(times[0], (x) => x.toFixed(2))}); service CPU ${median(cpu[SUBSCRIBERS]).toFixed(2)} s against ${median(cpu[0]).toFixed(2)} s; the subscribers' processes' CPU ${median(pagesCpu).toFixed(2)} s; service RSS with them ${median(rss)} KiB (median)`,
    '–',
    knobs,
  );
}

const CASE_FNS = { path: casePath, cli: caseCli, progress: caseProgress, concurrent: caseConcurrent, subscribers: caseSubscribers };

async function main() {
  for (const name of CASES) if (!CASE_FNS[name]) throw new Error(`no case ${name}: the cases are ${Object.keys(CASE_FNS).join(' ')}`);
  say(`binary ${binary}; node ${process.version}; ${os.cpus().length} CPUs; load average ${loadavg()}; stores under ${os.tmpdir()}`);
  const ctx = await Fixture.start(t);
  // The fixture's origin adds an 'error' listener to the socket per request,
  // and the service keeps a connection for many: no MaxListeners warnings.
  ctx.origin.server.on('secureConnection', (socket) => socket.setMaxListeners(0));
  const client = await ctx.connect();
  const idle = memory(ctx.service.pid);
  say(`idle service with the API open: RSS ${idle.rss} KiB (peak ${idle.peak} KiB)`);
  row('idle service with the API open', `RSS ${idle.rss} KiB (peak ${idle.peak} KiB)`, '–', { BENCH_API_CASES: CASES.join(' ') });
  for (const name of CASES) {
    say(`--- ${name}`);
    await CASE_FNS[name](ctx, client);
  }
  say(`load average at the end ${loadavg()}`);
  say('');
  say('| figure | result | target | command |');
  say('|---|---|---|---|');
  for (const r of rows) say(r);
  for (const fn of cleanups.reverse()) await fn();
}

main().catch(async (e) => {
  console.error(e);
  for (const fn of cleanups.reverse()) await fn().catch(() => {});
  process.exit(1);
});
