// The app's live network policy holds for the service, for the command
// line beside it, and after the service stopped.

import assert from 'node:assert/strict';
import { test } from 'node:test';

import { Fixture, sleep, waitFor, within } from './fixture.js';

test('set_policy blocks a host mid-download; the command line then refuses that host too, with or without the service', { timeout: 45_000 }, async (t) => {
  const ctx = await Fixture.start(t);
  const slow = ctx.origin.add('slow.bin', { size: 2 * 1024 * 1024 });
  ctx.origin.behave('slow.bin', { rate: 128 * 1024 }); // 16 s: still running when the policy changes
  const other = ctx.origin.add('other.bin', { size: 64 * 1024 });
  const client = await ctx.connect();
  await ctx.installGem('notes', [
    ctx.resource(slow, { id: 'slow', required: false }),
    ctx.resource(other, { id: 'other', required: false }),
  ], client);
  assert.deepEqual(await client.policy(), { mode: 'blocklist', hosts: [] });

  const sub = await client.forGem('notes').subscribe();
  t.after(() => sub.close());
  const events = [];
  const failed = within(20_000, (async () => {
    for await (const event of sub) {
      events.push(event);
      if (event.resource === 'slow' && ['failed', 'verified', 'cancelled'].includes(event.event)) return event;
    }
  })(), 'the end of the slow download');

  const answer = client.path('notes', 'slow').then(
    (ok) => ({ ok }),
    (error) => ({ error }),
  );
  // Under way: bytes have left the origin.
  await waitFor('the slow download to move', () => ctx.origin.bytesSent('slow.bin') > 64 * 1024);

  const changed = await client.setPolicy({ mode: 'blocklist', hosts: ['cdn.test'] });
  assert.equal(changed.stopped, 1, JSON.stringify(changed));
  assert.deepEqual(await client.policy(), { mode: 'blocklist', hosts: ['cdn.test'] });

  const end = await failed;
  assert.equal(end.event, 'failed', `the download ended with ${JSON.stringify(end)}`);
  assert.equal(end.primary_cause, 'E_RESOURCE_POLICY', JSON.stringify(end));
  assert.equal(end.code, 'E_RESOURCE_UNAVAILABLE');
  assert.ok(events.some((e) => e.event === 'policy_changed' && e.new_mode === 'blocklist'), 'no policy_changed event');
  const { error } = await answer;
  assert.ok(error, 'path succeeded although the policy stopped its download');
  assert.equal(error.primaryCause, 'E_RESOURCE_POLICY');
  assert.equal(error.code, 'E_RESOURCE_UNAVAILABLE');
  assert.ok(error.attempts.some((a) => a.code === 'E_RESOURCE_POLICY'), JSON.stringify(error.attempts));
  // The stopped download sends nothing more.
  const sentAfterStop = ctx.origin.bytesSent('slow.bin');
  await sleep(600);
  assert.equal(ctx.origin.activeResponses('slow.bin'), 0, 'the blocked download still holds a connection');
  assert.ok(ctx.origin.bytesSent('slow.bin') - sentAfterStop <= 128 * 1024, 'the origin kept sending');

  // The command line beside the service: the same policy.
  const beside = await ctx.cli(['path', 'notes', 'other']);
  assert.equal(beside.code, 1, `path succeeded: ${beside.stdout}`);
  assert.equal(beside.json?.primary_cause, 'E_RESOURCE_POLICY', beside.stdout + beside.stderr);
  assert.equal(ctx.origin.requestCount('other.bin'), 0, 'the blocked host got a request');

  // The policy outlives the service.
  assert.deepEqual(await ctx.stopService(), { code: 0, signal: null });
  for (const args of [['path', '--no-service', 'notes', 'other'], ['path', 'notes', 'other']]) {
    const alone = await ctx.cli(args);
    assert.equal(alone.code, 1, `${args.join(' ')} succeeded: ${alone.stdout}`);
    assert.equal(alone.json?.primary_cause, 'E_RESOURCE_POLICY', `${args.join(' ')}: ${alone.stdout}${alone.stderr}`);
  }
  assert.equal(ctx.origin.requestCount('other.bin'), 0, 'the blocked host got a request');
  assert.equal(ctx.origin.hostRequests('cdn.test'), ctx.origin.requestCount('slow.bin'));
});

