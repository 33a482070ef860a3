// A subscriber sees one download from queued to verified.

import assert from 'node:assert/strict';
import { test } from 'node:test';

import { Fixture, RFC3339_MS, within } from './fixture.js';

test('a subscriber sees queued, started, progress and verified, each with its time, address and source', { timeout: 30_000 }, async (t) => {
  const ctx = await Fixture.start(t);
  const file = ctx.origin.add('model.bin', { size: 1024 * 1024 });
  ctx.origin.behave('model.bin', { rate: 2 * 1024 * 1024 }); // about half a second: several progress steps
  const client = await ctx.connect();
  await ctx.installGem('notes', [ctx.resource(file, { id: 'model', required: false, description: 'The model' })], client);

  const sub = await client.forGem('notes').subscribe();
  t.after(() => sub.close());
  const [gem] = sub.status;
  assert.equal(gem.gem, 'notes');
  const [row] = gem.resources;
  assert.equal(row.id, 'model');
  assert.equal(row.state, 'missing');
  assert.equal(row.size, file.size);
  assert.equal(row.label, 'The model');

  const answer = client.path('notes', 'model');
  const events = [];
  await within(20_000, (async () => {
    for await (const event of sub) {
      if (event.resource !== 'model') continue;
      events.push(event);
      if (event.event === 'verified' || event.event === 'failed') break;
    }
  })(), 'the events of the download');
  const { path } = await answer;

  const kinds = events.map((e) => e.event);
  const compact = kinds.filter((k, i) => k !== 'progress' || kinds[i - 1] !== 'progress');
  assert.deepEqual(compact, ['queued', 'started', 'progress', 'verified'], `events: ${kinds.join(' ')}`);
  let last = 0;
  for (const event of events) {
    assert.equal(event.gem, 'notes');
    assert.equal(event.sha256, file.sha256);
    assert.match(event.at, RFC3339_MS, `${event.event}.at`);
    const at = Date.parse(event.at);
    assert.ok(Number.isFinite(at), event.at);
    assert.ok(Math.abs(at - Date.now()) < 60_000, `${event.event}.at is ${event.at}`);
    assert.ok(at >= last, 'events out of time order');
    last = at;
  }
  const byKind = (k) => events.filter((e) => e.event === k);
  assert.equal(byKind('queued')[0].size, file.size);
  assert.equal(byKind('started')[0].address, file.url());
  assert.equal(byKind('started')[0].size, file.size);
  let bytes = 0;
  for (const p of byKind('progress')) {
    assert.equal(p.address, file.url());
    assert.equal(p.size, file.size);
    assert.ok(p.bytes >= bytes && p.bytes <= file.size, `progress went from ${bytes} to ${p.bytes}`);
    bytes = p.bytes;
  }
  const verified = byKind('verified')[0];
  assert.equal(verified.served_by, file.url());
  assert.equal(verified.path, path);
});
