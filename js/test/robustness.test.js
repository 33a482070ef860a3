// Bad and slow clients: a malformed line, an oversized line, a subscriber
// that never reads. The service keeps serving everyone else.

import assert from 'node:assert/strict';
import fs from 'node:fs';
import { test } from 'node:test';

import { E_RESOURCE_LAGGED } from '../index.js';
import { Fixture, sha256, waitFor, within } from './fixture.js';

const hello = (id) => ({ jsonrpc: '2.0', id, method: 'hello' });

test('a malformed line gets -32700 and the connection goes on; a line over 1 MiB gets -32700 and is closed', { timeout: 30_000 }, async (t) => {
  const ctx = await Fixture.start(t);
  const bad = await ctx.raw();
  await bad.write('this is not json\n');
  const parse = await bad.waitFor((m) => m.error);
  assert.equal(parse.error.code, -32700, JSON.stringify(parse));
  assert.equal(parse.id, null);
  assert.equal(parse.error.data?.code, 'E_RESOURCE_USAGE', JSON.stringify(parse));
  // hello comes first: a method before it is an invalid request.
  await bad.send({ jsonrpc: '2.0', id: 7, method: 'status', params: {} });
  const early = await bad.waitFor((m) => m.id === 7);
  assert.equal(early.error.code, -32600, JSON.stringify(early));
  await bad.send(hello(8));
  assert.equal((await bad.waitFor((m) => m.id === 8)).result.protocol, 1);
  await bad.send({ jsonrpc: '2.0', id: 'not-a-request' });
  const invalid = await bad.waitFor((m) => m.error && m.error.code !== -32700);
  assert.equal(invalid.error.code, -32600, JSON.stringify(invalid));
  await bad.send({ jsonrpc: '2.0', id: 9, method: 'no_such_method' });
  const unknown = await bad.waitFor((m) => m.id === 9);
  assert.equal(unknown.error.code, -32601, JSON.stringify(unknown));
  await bad.send({ jsonrpc: '2.0', id: 10, method: 'path', params: { gem: 'notes' } });
  const params = await bad.waitFor((m) => m.id === 10);
  assert.equal(params.error.code, -32602, JSON.stringify(params));
  assert.equal(params.error.data?.code, 'E_RESOURCE_USAGE');
  await bad.send(hello(11));
  const answered = await bad.waitFor((m) => m.id === 11);
  assert.equal(answered.result.protocol, 1);

  const huge = await ctx.raw();
  const other = await ctx.connect();
  huge.write('"' + 'x'.repeat(1024 * 1024 + 16) + '"\n');
  const tooLong = await huge.waitFor((m) => m.error);
  assert.equal(tooLong.error.code, -32700, JSON.stringify(tooLong).slice(0, 300));
  assert.equal(await huge.waitClosed(5000), true, 'the connection of an oversized line stayed open');
  // Everyone else goes on.
  assert.equal((await other.hello()).protocol, 1);
  await bad.send(hello(12));
  assert.ok((await bad.waitFor((m) => m.id === 12)).result);
});

test('a subscriber that never reads holds up no download and no other client, and is told it lagged', { timeout: 60_000 }, async (t) => {
  // One connection per host: a held download keeps cdn.test busy (and its
  // gem's share of the downloads), so a file
  // of cdn.test asked for stays queued, and cancelling it is cheap. Two
  // events (queued, cancelled) per round, with no network and no disk.
  const ctx = await Fixture.start(t, {
    service: { max_concurrent_downloads: 2, max_per_host: 1 },
    network: { connections_per_file: 1 },
  });
  const held = ctx.origin.add('held.bin', { size: 64 * 1024 });
  ctx.origin.behave('held.bin', { hold: true });
  const queued = ctx.origin.add('queued.bin', { size: 1024 });
  const file = ctx.origin.add('small.bin', { size: 128 * 1024 });
  const client = await ctx.connect();
  await ctx.installGem('notes', [
    ctx.resource(held, { id: 'held' }),
    ctx.resource(queued, { id: 'queued' }),
  ], client);
  // Another gem and another host: neither limit holds it back.
  await ctx.installGem('tools', [ctx.resource(file, { id: 'small', host: 'mirror.test' })], client);
  await client.downloadNow('notes', 'held');
  await waitFor('the held download to connect', () => ctx.origin.activeResponses('held.bin') === 1);

  // A bare subscriber that stops reading once subscribed.
  const stuck = await ctx.raw();
  await stuck.send(hello(0));
  await stuck.waitFor((m) => m.id === 0);
  await stuck.send({ jsonrpc: '2.0', id: 1, method: 'subscribe', params: {} });
  const subscribed = await stuck.waitFor((m) => m.id === 1);
  const number = subscribed.result.subscription;
  stuck.socket.pause();
  // And a subscription of this client that nobody iterates.
  const idle = await client.subscribe();

  const flood = await ctx.connect();
  const ROUNDS = 1500;
  let rounds = 0;
  const started = Date.now();
  const flooding = (async () => {
    while (rounds < ROUNDS) {
      rounds++;
      await flood.downloadNow('notes', 'queued');
      await flood.cancel('notes', 'queued');
    }
  })();

  // Meanwhile: another client's hello and path answer, and a download completes.
  await waitFor('the flood to be under way', () => rounds >= ROUNDS / 3);
  const t0 = Date.now();
  assert.equal((await within(2000, client.hello(), 'hello during the flood')).protocol, 1);
  const helloMs = Date.now() - t0;
  const { path } = await within(10_000, client.path('tools', 'small'), 'path during the flood');
  assert.equal(sha256(fs.readFileSync(path)), file.sha256);
  await within(30_000, flooding, 'the flood');
  const floodMs = Date.now() - started;
  assert.ok(helloMs < 1000, `hello took ${helloMs} ms`);
  assert.equal(ctx.origin.requestCount('queued.bin'), 0, 'a queued file was fetched');

  // The stuck subscriber reads again: what was queued, then `lagged`.
  stuck.socket.resume();
  const lagged = await stuck.waitFor((m) => m.method === 'lagged', 10_000);
  assert.equal(lagged.params.subscription, number);
  assert.ok(lagged.params.missed >= 1, JSON.stringify(lagged));

  // The client's idle subscription: its events, then E_RESOURCE_LAGGED.
  let read = 0;
  const error = await within(10_000, (async () => {
    for await (const event of idle) read += event ? 1 : 0;
  })(), 'the idle subscription').then(
    () => assert.fail('the idle subscription ended without lagging'),
    (e) => e,
  );
  assert.equal(error.code, E_RESOURCE_LAGGED, error.message);
  assert.ok(read < 2 * ROUNDS, `${read} events read of ${2 * ROUNDS}: nothing was missed`);
  // Subscribing again gives a fresh status to redraw from.
  const again = await client.subscribe({ gem: 'tools' });
  assert.equal(again.status[0].resources.find((r) => r.id === 'small').state, 'present');
  again.close();
  t.diagnostic(`${ROUNDS} rounds in ${floodMs} ms; hello answered in ${helloMs} ms during them; the idle subscription read ${read} events; the stuck one got ${JSON.stringify(lagged.params)}, the idle one missed ${error.missed}`);
});
