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
  // Every field PROTOCOL.md gives each event, all checked before failing, so
  // one run names every difference.
  const problems = [];
  const expect = (ok, what) => {
    if (!ok) problems.push(what);
  };
  let last = 0;
  for (const event of events) {
    const name = `${event.event} ${JSON.stringify(event)}`;
    expect(event.gem === 'notes', `${name}: gem`);
    expect(event.sha256 === file.sha256, `${name}: sha256`);
    expect(typeof event.at === 'string' && RFC3339_MS.test(event.at), `${name}: no \`at\` in RFC 3339 with milliseconds`);
    const at = Date.parse(event.at);
    if (Number.isFinite(at)) {
      expect(Math.abs(at - Date.now()) < 60_000, `${name}: \`at\` is not now`);
      expect(at >= last, `${name}: \`at\` earlier than the event before`);
      last = at;
    }
    if (event.event === 'queued') expect(event.size === file.size, `${name}: size`);
    if (event.event === 'started' || event.event === 'progress') {
      expect(event.size === file.size, `${name}: size`);
      expect(event.address === file.url(), `${name}: \`address\` is not ${file.url()}`);
    }
    if (event.event === 'verified') {
      expect(event.path === path, `${name}: path is not ${path}`);
      expect(event.served_by === file.url(), `${name}: \`served_by\` is not ${file.url()}`);
    }
  }
  let bytes = 0;
  for (const p of events.filter((e) => e.event === 'progress')) {
    expect(p.bytes >= bytes && p.bytes <= file.size, `progress went from ${bytes} to ${p.bytes}`);
    expect(Number.isInteger(p.bytes_per_sec) && p.bytes_per_sec >= 0, `progress without bytes_per_sec: ${JSON.stringify(p)}`);
    expect(p.eta_secs === null || Number.isInteger(p.eta_secs), `progress with a bad eta_secs: ${JSON.stringify(p)}`);
    bytes = p.bytes;
  }
  assert.deepEqual(problems, []);
});
