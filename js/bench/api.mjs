// The local API's figures (BENCHMARKS.md, "The local API"):
//   - `path` of a present file from Node over the API, p50 and p99, against
//     starting the command line per call (through the service, and in its
//     own process);
//   - one download with 0 and with N subscribers on the service: its time,
//     and the service's memory;
//   - the memory of an idle service with the API open.
//
//   GEM_RESOURCES_BIN=target/release/gem-resources node js/bench/api.mjs
//
// Knobs: BENCH_API_CALLS (2000), BENCH_API_CLI_CALLS (100),
// BENCH_API_SUBSCRIBERS (1000), BENCH_API_MIB (256), BENCH_API_RUNS (3).
// Everything runs on 127.0.0.1: the test fixture's origin and a real serve.

import fs from 'node:fs';
import net from 'node:net';
import { spawnSync } from 'node:child_process';

import { Fixture, binary } from '../test/fixture.js';

const CALLS = Number(process.env.BENCH_API_CALLS ?? 2000);
const CLI_CALLS = Number(process.env.BENCH_API_CLI_CALLS ?? 100);
const SUBSCRIBERS = Number(process.env.BENCH_API_SUBSCRIBERS ?? 1000);
const MIB = Number(process.env.BENCH_API_MIB ?? 256);
const RUNS = Number(process.env.BENCH_API_RUNS ?? 3);

const cleanups = [];
const t = { after: (fn) => cleanups.push(fn) };

function quantile(samples, q) {
  const sorted = [...samples].sort((a, b) => a - b);
  return sorted[Math.min(sorted.length - 1, Math.floor(q * sorted.length))];
}

function ms(ns) {
  return (Number(ns) / 1e6).toFixed(3);
}

function memory(pid) {
  const status = fs.readFileSync(`/proc/${pid}/status`, 'utf8');
  const kib = (key) => Number(status.match(new RegExp(`${key}:\\s+(\\d+)`))[1]);
  return { rss: kib('VmRSS'), peak: kib('VmHWM') };
}

/** A bare subscriber that reads (and counts) its events. */
function subscriber(socket) {
  return new Promise((resolve, reject) => {
    const conn = net.createConnection(socket);
    const state = { conn, events: 0, answered: false };
    let buffered = '';
    conn.setEncoding('utf8');
    conn.on('error', reject);
    conn.on('connect', () => conn.write('{"jsonrpc":"2.0","id":1,"method":"subscribe","params":{}}\n'));
    conn.on('data', (chunk) => {
      buffered += chunk;
      let at;
      while ((at = buffered.indexOf('\n')) >= 0) {
        const line = buffered.slice(0, at);
        buffered = buffered.slice(at + 1);
        if (!state.answered && line.includes('"id":1')) {
          state.answered = true;
          resolve(state);
        } else if (line.includes('"method":"event"')) {
          state.events += 1;
        }
      }
    });
  });
}

async function download(ctx, client, gem, file) {
  await ctx.installGem(gem, [ctx.resource(file, { id: 'big' })], client);
  const start = process.hrtime.bigint();
  await client.path(gem, 'big');
  return Number(process.hrtime.bigint() - start) / 1e9;
}

async function main() {
  const ctx = await Fixture.start(t);
  const pid = ctx.service.pid;
  const client = await ctx.connect();
  const idle = memory(pid);
  console.log(`binary ${binary}`);
  console.log(`idle service with the API open: RSS ${idle.rss} KiB (peak ${idle.peak} KiB)`);

  // path of a present file.
  const small = ctx.origin.add('small.bin', { size: 64 * 1024 });
  await ctx.installGem('p', [ctx.resource(small, { id: 'small' })], client);
  await client.path('p', 'small');
  const api = [];
  for (let i = 0; i < CALLS; i++) {
    const start = process.hrtime.bigint();
    await client.path('p', 'small');
    api.push(Number(process.hrtime.bigint() - start));
  }
  console.log(`path over the API from Node (${CALLS} calls, one connection): p50 ${ms(quantile(api, 0.5))} ms, p99 ${ms(quantile(api, 0.99))} ms`);
  for (const [label, extra] of [['through the service', []], ['in its own process (--no-service)', ['--no-service']]]) {
    const cli = [];
    for (let i = 0; i < CLI_CALLS; i++) {
      const start = process.hrtime.bigint();
      const out = spawnSync(binary, [...ctx.baseArgs(), ...extra, 'path', 'p', 'small']);
      cli.push(Number(process.hrtime.bigint() - start));
      if (out.status !== 0) throw new Error(`path failed: ${out.stderr}`);
    }
    console.log(`path by starting the CLI per call, ${label} (${CLI_CALLS} calls): p50 ${ms(quantile(cli, 0.5))} ms, p99 ${ms(quantile(cli, 0.99))} ms`);
  }

  // One download, with and without subscribers; interleaved runs.
  const big = ctx.origin.add('big.bin', { size: MIB * 1024 * 1024 });
  const times = { 0: [], [SUBSCRIBERS]: [] };
  let peers = [];
  let events = 0;
  for (let run = 0; run < RUNS; run++) {
    for (const count of [0, SUBSCRIBERS]) {
      peers = [];
      for (let i = 0; i < count; i++) peers.push(await subscriber(ctx.service.socket));
      const gem = `d${run}-${count}`;
      times[count].push(await download(ctx, client, gem, big));
      if (count > 0) {
        const mem = memory(pid);
        events = peers.reduce((n, p) => n + p.events, 0);
        console.log(`  run ${run + 1}: ${count} subscribers, RSS ${mem.rss} KiB (peak ${mem.peak} KiB), ${events} events delivered`);
      }
      for (const p of peers) p.conn.destroy();
      await client.uninstall(gem);
    }
  }
  const median = (xs) => quantile(xs, 0.5);
  for (const count of [0, SUBSCRIBERS]) {
    const s = median(times[count]);
    console.log(`download of ${MIB} MiB with ${count} subscribers: median ${s.toFixed(2)} s (${(MIB / s).toFixed(0)} MiB/s) of ${times[count].map((x) => x.toFixed(2)).join(', ')}`);
  }
  console.log(`with ${SUBSCRIBERS} subscribers ÷ without: ${(median(times[SUBSCRIBERS]) / median(times[0])).toFixed(3)}`);
  for (const fn of cleanups.reverse()) await fn();
}

main().catch(async (e) => {
  console.error(e);
  for (const fn of cleanups.reverse()) await fn().catch(() => {});
  process.exit(1);
});
