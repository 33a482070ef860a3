// Bad and slow clients: a malformed line, an oversized line, a subscriber
// that never reads. The service keeps serving everyone else.

import assert from 'node:assert/strict';
import fs from 'node:fs';
import { test } from 'node:test';

import { E_RESOURCE_LAGGED } from '../index.js';
import { Fixture, sha256, within } from './fixture.js';

const hello = (id) => ({ jsonrpc: '2.0', id, method: 'hello' });

test('a malformed line gets -32700 and the connection goes on; a line over 1 MiB gets -32700 and is closed', { timeout: 30_000 }, async (t) => {
  const ctx = await Fixture.start(t);
  const bad = await ctx.raw();
  await bad.write('this is not json\n');
  const parse = await bad.waitFor((m) => m.error);
  assert.equal(parse.error.code, -32700, JSON.stringify(parse));
  assert.equal(parse.id, null);
  assert.equal(parse.error.data?.code, 'E_RESOURCE_USAGE', JSON.stringify(parse));
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
  const ctx = await Fixture.start(t);
  const file = ctx.origin.add('small.bin', { size: 128 * 1024 });
  const client = await ctx.connect();
  await ctx.installGem('notes', [ctx.resource(file, { id: 'small', required: false })], client);

  // A bare subscriber that stops reading once subscribed.
  const stuck = await ctx.raw();
  await stuck.send({ jsonrpc: '2.0', id: 1, method: 'subscribe', params: {} });
  const subscribed = await stuck.waitFor((m) => m.id === 1);
  const number = subscribed.result.subscription;
  stuck.socket.pause();
  // And a subscription of this client that nobody iterates.
  const idle = await client.subscribe();

  // Many events, each a few KiB: policy changes with long host lists.
  const hosts = (tag) => Array.from({ length: 200 }, (_, i) => `host-${tag}-${i}.example.test`);
  const flood = await ctx.connect();
  let sent = 0;
  const COUNT = 1500;
  const flooding = (async () => {
    const workers = Array.from({ length: 16 }, async () => {
      while (sent < COUNT) {
        const n = sent++;
        await flood.setPolicy({ mode: 'blocklist', hosts: hosts(n % 2 ? 'a' : 'b') });
      }
    });
    await Promise.all(workers);
  })();

  // Meanwhile: another client's hello and path answer, and a download completes.
  const started = Date.now();
  while (sent < COUNT / 2) await new Promise((r) => setTimeout(r, 20));
  const t0 = Date.now();
  assert.equal((await within(2000, client.hello(), 'hello during the flood')).protocol, 1);
  const helloMs = Date.now() - t0;
  const { path } = await within(10_000, client.path('notes', 'small'), 'path during the flood');
  assert.equal(sha256(fs.readFileSync(path)), file.sha256);
  await within(45_000, flooding, 'the policy changes');
  const floodMs = Date.now() - started;
  assert.ok(helloMs < 1000, `hello took ${helloMs} ms`);

  // The stuck subscriber reads again: what was queued, then `lagged`.
  stuck.socket.resume();
  const lagged = await stuck.waitFor((m) => m.method === 'lagged', 10_000);
  assert.equal(lagged.params.subscription, number);
  assert.ok(lagged.params.missed >= 1, JSON.stringify(lagged));

  // The client's idle subscription: its events, then E_RESOURCE_LAGGED.
  const error = await within(10_000, (async () => {
    for await (const event of idle) void event;
  })(), 'the idle subscription').then(
    () => assert.fail('the idle subscription ended without lagging'),
    (e) => e,
  );
  assert.equal(error.code, E_RESOURCE_LAGGED, error.message);
  // Subscribing again gives a fresh status to redraw from.
  const again = await client.subscribe({ gem: 'notes' });
  assert.equal(again.status[0].resources[0].state, 'present');
  again.close();
  t.diagnostic(`${COUNT} policy changes in ${floodMs} ms; hello answered in ${helloMs} ms during them`);
});
