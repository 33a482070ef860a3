// The gem page's model (js/model.js): rows from a status, kept true by event
// sequences, lagged subscriptions and the client's `resubscribed` item; and
// once against a real service.

import assert from 'node:assert/strict';
import { EventEmitter } from 'node:events';
import { test } from 'node:test';

import { ETA_AFTER_MS, GemPageModel, describeError, formatBytes, formatClock, formatDuration, stateText, watchGem } from '../model.js';

import { Fixture, waitFor, within } from './fixture.js';
import { FakeSource, statusRow } from './page-fixture.js';

const SHA_A = 'a'.repeat(64);
const SHA_B = 'b'.repeat(64);
const POLICY_MESSAGE =
  'resource "model": every address failed\n  - E_RESOURCE_POLICY: https://cdn.test:8443/model.bin: host cdn.test is not permitted by the network policy (blocklist mode)';

function notes(rows = [statusRow({ id: 'model', sha256: SHA_A, required: true, description: 'The OCR model' }), statusRow({ id: 'voices', sha256: SHA_B, host: 'mirror.test', size: 1000 })]) {
  return [{ gem: 'notes', installed_by: { kind: 'api' }, resources: rows }];
}

const file = (event, fields = {}) => ({ event, at: '2026-12-01T18:40:02.513Z', gem: 'notes', resource: 'model', sha256: SHA_A, ...fields });

test('rows from a status: description, size, host without a port, eager or lazy, state in words', () => {
  const model = new GemPageModel('notes');
  assert.equal(model.installed, null);
  model.reset({ gems: notes(), undeclared_files: 0, undeclared_bytes: 0 });
  assert.equal(model.installed, true);
  const [a, b] = model.rows;
  assert.equal(a.id, 'model');
  assert.equal(a.description, 'The OCR model');
  assert.equal(a.size, 3 * 1024 * 1024);
  assert.equal(a.host, 'cdn.test', 'the host comes from the row, never from the address with its port');
  assert.equal(a.required, true);
  assert.equal(a.eager, true);
  assert.equal(a.when, 'install');
  assert.equal(a.text, 'Not downloaded yet');
  assert.equal(b.host, 'mirror.test');
  assert.equal(b.eager, false);
  assert.equal(b.when, 'use');
  assert.equal(b.description, null);
  assert.equal(b.text, 'Not downloaded: downloads when first used');
  assert.ok(Object.isFrozen(model.rows) && Object.isFrozen(a));

  model.reset([]);
  assert.equal(model.installed, false);
  assert.deepEqual(model.rows, []);
});

test('a download from queued to verified: bytes, the service rate and time left, never a rate of its own', () => {
  const model = new GemPageModel('notes');
  model.reset(notes());
  const changes = [];
  model.onChange((m) => changes.push(m.row('model')));
  model.apply(file('queued', { size: 3 * 1024 * 1024 }));
  assert.equal(model.row('model').state, 'queued');
  assert.equal(model.row('model').text, 'Queued to download');
  model.apply(file('started', { size: 3 * 1024 * 1024, address: 'https://cdn.test:8443/model.bin' }));
  assert.equal(model.row('model').state, 'downloading');
  assert.equal(model.row('model').bytes, 0);
  assert.equal(model.row('model').text, 'Downloading: 0 B of 3.0 MiB (0%), time left: --', 'no rate yet: no time left');
  model.apply(file('progress', { bytes: 1024 * 1024, size: 3 * 1024 * 1024, address: 'https://cdn.test:8443/model.bin', bytes_per_sec: 1000, eta_secs: 2097 }));
  let row = model.row('model');
  assert.equal(row.bytes, 1024 * 1024);
  assert.equal(row.rate, 1000, 'the rate is the event’s bytes_per_sec, whatever the bytes did');
  assert.equal(row.etaSecs, 2097);
  assert.equal(row.fraction, 1 / 3);
  // Just started: the first estimate is a guess, and reads `--`; the
  // service's estimate once the download has run ETA_AFTER_MS.
  assert.equal(row.text, 'Downloading: 1.0 MiB of 3.0 MiB (33%), 1000 B/s, time left: --');
  assert.equal(stateText(row, row.since + ETA_AFTER_MS), 'Downloading: 1.0 MiB of 3.0 MiB (33%), 1000 B/s, about 35 min left');
  assert.equal(row.host, 'cdn.test');
  model.apply(file('progress', { bytes: 2 * 1024 * 1024, size: 3 * 1024 * 1024, address: 'https://cdn.test:8443/model.bin', bytes_per_sec: 0, eta_secs: null }));
  row = model.row('model');
  assert.equal(row.rate, 0);
  assert.equal(row.etaSecs, null);
  assert.equal(row.text, 'Downloading: 2.0 MiB of 3.0 MiB (66%), stalled');
  model.apply(file('verified', { path: '/store/model.bin', served_by: 'https://cdn.test:8443/model.bin' }));
  row = model.row('model');
  assert.equal(row.state, 'present');
  assert.equal(row.bytes, row.size);
  assert.equal(row.rate, null);
  assert.equal(row.path, '/store/model.bin');
  assert.equal(row.text, 'Downloaded and verified');
  assert.equal(changes.length, 5);
  assert.equal(model.row('voices').state, 'missing', 'the other row is untouched');
});

test('a policy block is stated in words, from the event and from a status row; policy_changed is kept', () => {
  const model = new GemPageModel('notes');
  model.reset(notes());
  model.apply(file('progress', { bytes: 4096, size: 3 * 1024 * 1024, address: 'https://cdn.test:8443/model.bin', bytes_per_sec: 4096, eta_secs: 700 }));
  model.apply({ event: 'policy_changed', at: '2026-12-01T18:40:03.000Z', old_mode: 'blocklist', old_hosts: 0, new_mode: 'blocklist', new_hosts: 1 });
  assert.deepEqual({ ...model.policy }, { mode: 'blocklist', hosts: 1, oldMode: 'blocklist', oldHosts: 0, at: '2026-12-01T18:40:03.000Z' });
  model.apply(file('failed', { code: 'E_RESOURCE_UNAVAILABLE', primary_cause: 'E_RESOURCE_POLICY', message: POLICY_MESSAGE }));
  const row = model.row('model');
  assert.equal(row.state, 'failed');
  assert.equal(row.blocked, true);
  assert.equal(row.partialBytes, 4096);
  assert.equal(row.error.headline, 'Blocked by the network policy');
  assert.equal(row.error.detail, 'host cdn.test is not permitted by the network policy (blocklist mode)');
  assert.equal(
    row.text,
    'Failed. Blocked by the network policy: host cdn.test is not permitted by the network policy (blocklist mode) (E_RESOURCE_UNAVAILABLE, caused by E_RESOURCE_POLICY). 4.0 KiB of 3.0 MiB kept',
  );

  // The same from a status row, with its attempts.
  const fromStatus = new GemPageModel('notes');
  fromStatus.reset(notes([statusRow({
    id: 'model',
    sha256: SHA_A,
    state: 'failed',
    code: 'E_RESOURCE_UNAVAILABLE',
    primary_cause: 'E_RESOURCE_POLICY',
    message: POLICY_MESSAGE,
    attempts: [{ address: 'https://cdn.test:8443/model.bin', code: 'E_RESOURCE_POLICY', reason: 'host cdn.test is not permitted by the network policy (blocklist mode)' }],
    partial_bytes: 4096,
  })]));
  assert.equal(fromStatus.row('model').text, row.text);
  assert.equal(fromStatus.row('model').partialBytes, 4096);

  // Permitted again: the service queues the failed file again.
  model.apply(file('queued', { size: 3 * 1024 * 1024 }));
  assert.equal(model.row('model').error, null);
  assert.equal(model.row('model').blocked, false);
});

test('other failures: the reason of each address, the codes', () => {
  const e = describeError({
    code: 'E_RESOURCE_UNAVAILABLE',
    primary_cause: 'E_RESOURCE_HTTP',
    message: 'resource "a": every address failed\n  - E_RESOURCE_HTTP: https://cdn.test/a: HTTP status 404\n  - E_RESOURCE_NETWORK: https://mirror.test/a: connection refused',
  });
  assert.equal(e.policy, false);
  assert.equal(e.text, 'Not found on the server: HTTP status 404; connection refused (E_RESOURCE_UNAVAILABLE, caused by E_RESOURCE_HTTP)');
  const http = (status) => describeError({ code: 'E_RESOURCE_UNAVAILABLE', primary_cause: 'E_RESOURCE_HTTP', message: `resource "a": every address failed\n  - E_RESOURCE_HTTP: https://cdn.test/a: HTTP status ${status}` }).headline;
  assert.equal(http(500), 'The server had an error');
  assert.equal(http(403), 'The server refused the download');
  assert.equal(describeError({ code: 'E_RESOURCE_DISK_SPACE', primary_cause: 'E_RESOURCE_DISK_SPACE', message: 'no space left' }).text, 'Not enough disk space: no space left (E_RESOURCE_DISK_SPACE)');
  assert.equal(formatBytes(0), '0 B');
  assert.equal(formatBytes(1536), '1.5 KiB');
  assert.equal(formatDuration(59), '59 s');
  assert.equal(formatDuration(3900), '1 h 5 min');
});

test('every event of PROTOCOL.md’s table: resumed, retrying, fell_back, waiting, cancelled, deleted, installed, uninstalled', () => {
  const model = new GemPageModel('notes');
  model.reset(notes());
  model.apply(file('started', { size: 3 * 1024 * 1024, address: 'https://cdn.test:8443/model.bin' }));
  model.apply(file('resumed', { offset: 1024 * 1024, size: 3 * 1024 * 1024, address: 'https://cdn.test:8443/model.bin' }));
  assert.equal(model.row('model').bytes, 1024 * 1024);
  model.apply(file('retrying', { address: 'https://cdn.test:8443/model.bin', attempt: 2, of: 3, wait_ms: 1000, reason: 'connection reset' }));
  assert.equal(model.row('model').text, 'Downloading: 1.0 MiB of 3.0 MiB (33%), retrying (attempt 2 of 3) in 1 s: connection reset');
  model.apply(file('fell_back', { from: 'https://cdn.test:8443/model.bin', hop: null, to: 'https://mirror.test:8443/model.bin', code: 'E_RESOURCE_HTTP', reason: 'HTTP status 503' }));
  assert.equal(model.row('model').address, 'https://mirror.test:8443/model.bin');
  assert.match(model.row('model').text, /switched to mirror\.test after: HTTP status 503/);
  assert.equal(model.row('model').host, 'cdn.test', 'the row’s host stays the status row’s');
  model.apply(file('cancelled', { reason: 'cancelled by the app' }));
  assert.equal(model.row('model').state, 'missing');
  assert.equal(model.row('model').partialBytes, 1024 * 1024);
  assert.equal(model.row('model').text, 'Stopped (cancelled by the app); 1.0 MiB of 3.0 MiB kept for later. Not downloaded yet');
  model.apply(file('waiting', { on: 'letters' }));
  assert.equal(model.row('model').state, 'waiting');
  assert.equal(model.row('model').text, 'Waiting: gem letters is downloading the same file');
  model.apply(file('verified', { path: '/p', served_by: null }));
  model.apply(file('deleted'));
  assert.equal(model.row('model').state, 'missing');
  assert.equal(model.row('model').path, null);

  // Events of another gem, or of another version of the file, are not this row's.
  assert.equal(model.apply({ ...file('progress', { bytes: 5, size: 10, bytes_per_sec: 5, eta_secs: 1 }), gem: 'letters' }), false);
  assert.equal(model.apply(file('queued', { sha256: 'c'.repeat(64), size: 10 })), false);
  assert.equal(model.apply({ event: 'something_new', at: 'x', gem: 'notes' }), false);

  // An upgrade: the rows of the new version.
  model.apply({ event: 'installed', at: '2026-12-01T18:41:00.000Z', gem: 'notes', resources: [statusRow({ id: 'model2', sha256: 'd'.repeat(64), required: true })] });
  assert.deepEqual(model.rows.map((r) => r.id), ['model2']);
  model.apply({ event: 'installed', at: '2026-12-01T18:41:00.000Z', gem: 'letters', resources: [] });
  assert.deepEqual(model.rows.map((r) => r.id), ['model2'], 'another gem’s install changes nothing');
  model.apply({ event: 'uninstalled', at: '2026-12-01T18:42:00.000Z', gem: 'notes' });
  assert.equal(model.installed, false);
  assert.deepEqual(model.rows, []);
});

test('the client’s resubscribed item (the service restarted) redraws every row from its status', () => {
  const model = new GemPageModel('notes');
  model.reset(notes());
  model.apply(file('progress', { bytes: 4096, size: 3 * 1024 * 1024, bytes_per_sec: 4096, eta_secs: 700 }));
  const restarted = notes([
    statusRow({ id: 'model', sha256: SHA_A, required: true, state: 'present', path: '/p' }),
    statusRow({ id: 'voices', sha256: SHA_B, host: 'mirror.test', state: 'downloading', bytes: 10, bytes_per_sec: 5 }),
  ]);
  assert.equal(model.apply({ event: 'resubscribed', at: '2026-12-01T18:45:00.000Z', reason: 'service restarted', status: restarted }), true);
  assert.equal(model.row('model').state, 'present');
  assert.equal(model.row('model').rate, null);
  assert.equal(model.row('voices').state, 'downloading');
  assert.equal(model.row('voices').rate, 5, 'a status row’s bytes_per_sec is the service’s rate too');
});

test('watchGem: a lagged subscription is taken again and the rows redrawn from its new status; a lost one after a pause', { timeout: 10_000 }, async (t) => {
  const source = new FakeSource();
  const draws = [];
  const watch = watchGem(source, 'notes', (rows) => draws.push(rows), { retryDelaysMs: [20] });
  t.after(() => watch.stop());

  const first = await source.nextSubscription();
  assert.deepEqual(first.options, { gem: 'notes' });
  first.open(notes());
  await watch.ready;
  first.push(file('progress', { bytes: 4096, size: 3 * 1024 * 1024, bytes_per_sec: 4096, eta_secs: 700 }));
  await waitFor('the progress drawn', () => watch.model.row('model')?.bytes === 4096);
  assert.equal(watch.model.connection.state, 'live');

  // The service ends it for falling behind: the verified event was missed.
  first.fail(Object.assign(new Error('lagged'), { code: 'E_RESOURCE_LAGGED', missed: 3 }));
  const second = await within(2000, source.nextSubscription(), 'a new subscription after lagged');
  assert.equal(first.closed, true);
  second.open(notes([statusRow({ id: 'model', sha256: SHA_A, required: true, state: 'present' })]));
  await waitFor('the redraw from the new status', () => watch.model.row('model')?.state === 'present');
  assert.deepEqual(watch.model.rows.map((r) => r.id), ['model']);
  assert.deepEqual({ ...watch.model.connection.lagged }, { missed: 3 });
  assert.equal(draws.at(-1), watch.model.rows);

  // The connection is lost: the model says so, then subscribes again.
  second.fail(Object.assign(new Error('the connection closed'), { code: 'E_RESOURCE_SERVICE' }));
  await waitFor('the lost feed shown', () => watch.model.connection.state !== 'live');
  const third = await within(2000, source.nextSubscription(), 'a new subscription after a lost connection');
  assert.ok(['lost', 'connecting'].includes(watch.model.connection.state));
  assert.equal(watch.model.connection.error.code, 'E_RESOURCE_SERVICE');
  third.open(notes());
  await waitFor('live again', () => watch.model.connection.state === 'live' && watch.model.row('model')?.state === 'missing');

  watch.stop();
  assert.equal(third.closed, true);
  assert.equal(watch.model.connection.state, 'stopped');
});

test('watchGem: a subscription without a status of its own is drawn from source.status(gem)', { timeout: 10_000 }, async (t) => {
  const source = new FakeSource({ withStatus: false, status: { gems: notes() } });
  const watch = watchGem(source, 'notes');
  t.after(() => watch.stop());
  const sub = await source.nextSubscription();
  sub.open();
  await watch.ready;
  assert.deepEqual(source.statusCalls, ['notes']);
  assert.deepEqual(watch.model.rows.map((r) => r.id), ['model', 'voices']);
});

test('watchGem: a client that says disconnected shows the feed lost until its subscription is taken again', { timeout: 10_000 }, async (t) => {
  const source = new FakeSource();
  const emitter = new EventEmitter();
  source.on = emitter.on.bind(emitter);
  source.off = emitter.off.bind(emitter);
  const watch = watchGem(source, 'notes');
  t.after(() => watch.stop());
  const sub = await source.nextSubscription();
  sub.open(notes());
  await watch.ready;
  sub.push(file('progress', { bytes: 4096, size: 3 * 1024 * 1024, bytes_per_sec: 4096, eta_secs: 700 }));
  await waitFor('the progress drawn', () => watch.model.row('model')?.bytes === 4096);

  emitter.emit('disconnected', Object.assign(new Error('the service went away'), { code: 'E_RESOURCE_SERVICE' }));
  assert.equal(watch.model.connection.state, 'lost');
  assert.equal(watch.model.connection.error.message, 'the service went away');
  // The same subscription, on the next service: its status redraws the rows.
  sub.push({ event: 'resubscribed', at: '2026-12-01T18:45:00.000Z', reason: 'service restarted', status: notes([statusRow({ id: 'model', sha256: SHA_A, required: true, state: 'queued' })]) });
  await waitFor('the redraw', () => watch.model.row('model')?.state === 'queued');
  assert.equal(watch.model.connection.state, 'live');
  assert.equal(source.subscriptions.length, 1, 'no new subscription: the client took it again itself');

  emitter.emit('disconnected', new Error('gone again'));
  emitter.emit('reconnected', {});
  assert.equal(watch.model.connection.state, 'live');
  watch.stop();
  assert.equal(emitter.listenerCount('disconnected') + emitter.listenerCount('reconnected'), 0);
});

test('against a real service: the rows follow a throttled download to verified, and a policy block in words', { timeout: 60_000 }, async (t) => {
  let watch = null;
  t.after(() => watch?.stop()); // before the service stops: no resubscribing to a service going away
  const ctx = await Fixture.start(t);
  const big = ctx.origin.add('big.bin', { size: 768 * 1024 });
  ctx.origin.behave('big.bin', { rate: 256 * 1024 });
  const lazy = ctx.origin.add('lazy.bin', { size: 64 * 1024 });
  const client = await ctx.connect();

  const progress = [];
  watch = watchGem(client, 'notes', (rows) => {
    const row = rows.find((r) => r.id === 'big');
    if (row?.state === 'downloading' && row.rate !== null) progress.push(row);
  });
  await within(10_000, watch.ready, 'the first status');
  assert.equal(watch.model.installed, false, 'not installed yet');

  await within(10_000, ctx.installGem('notes', [
    ctx.resource(big, { id: 'big', required: true, description: 'Handwriting model' }),
    ctx.resource(lazy, { id: 'lazy', host: 'mirror.test', description: 'Extra voices' }),
  ], client), 'the install');
  await waitFor('the rows of the installed gem', () => watch.model.rows.length === 2);
  const lazyRow = watch.model.row('lazy');
  assert.equal(lazyRow.description, 'Extra voices');
  assert.equal(lazyRow.host, 'mirror.test');
  assert.equal(lazyRow.when, 'use');
  assert.equal(lazyRow.size, 64 * 1024);
  assert.equal(watch.model.row('big').host, 'cdn.test');
  assert.equal(watch.model.row('big').when, 'install');

  await waitFor('the required file verified', () => watch.model.row('big').state === 'present', { timeout: 30_000 });
  assert.ok(progress.length >= 2, `progress rows: ${progress.length}`);
  for (const row of progress) {
    assert.ok(Number.isInteger(row.rate) && row.rate > 0, `rate ${row.rate}`);
    assert.ok(row.etaSecs === null || Number.isInteger(row.etaSecs));
    assert.match(row.text, /^Downloading: .* of 768\.0 KiB \(\d+%\)/);
  }
  assert.ok(progress.at(-1).bytes > progress[0].bytes, 'the bytes grew');
  assert.equal(watch.model.row('big').text, 'Downloaded and verified');
  assert.equal(watch.model.row('lazy').state, 'missing', 'a lazy file waits to be used');

  // The lazy file's host blocked: using it fails, in words.
  await client.setPolicy({ mode: 'blocklist', hosts: ['mirror.test'] });
  await waitFor('the policy change seen', () => watch.model.policy?.hosts === 1);
  await assert.rejects(within(10_000, client.path('notes', 'lazy'), 'path of the blocked file'), (e) => e.primaryCause === 'E_RESOURCE_POLICY');
  await waitFor('the blocked row', () => watch.model.row('lazy').state === 'failed');
  const blocked = watch.model.row('lazy');
  assert.equal(blocked.blocked, true);
  assert.match(blocked.text, /^Failed\. Blocked by the network policy: host mirror\.test is not permitted by the network policy \(blocklist mode\)/);

  // The same rows from a fresh status.
  const again = new GemPageModel('notes');
  again.reset(await within(10_000, client.status('notes'), 'status'));
  assert.deepEqual(again.rows.map((r) => [r.id, r.state, r.text]), watch.model.rows.map((r) => [r.id, r.state, r.text]));
});

test('against a real service that restarts: the rows say the feed was lost, then follow the new service to verified', { timeout: 60_000 }, async (t) => {
  let watch = null;
  t.after(() => watch?.stop());
  const ctx = await Fixture.start(t);
  const big = ctx.origin.add('big.bin', { size: 2 * 1024 * 1024 });
  ctx.origin.behave('big.bin', { rate: 128 * 1024 });
  const client = await ctx.connect();
  await within(10_000, ctx.installGem('notes', [ctx.resource(big, { id: 'big', required: true, description: 'Handwriting model' })], client), 'the install');
  const states = [];
  watch = watchGem(client, 'notes', (_rows, m) => {
    if (states.at(-1) !== m.connection.state) states.push(m.connection.state);
  });
  await within(10_000, watch.ready, 'the first status');
  await waitFor('the download under way', () => watch.model.row('big')?.bytes > 0);

  await ctx.service.stop();
  await waitFor('the feed shown lost', () => watch.model.connection.state === 'lost');
  await ctx.startService();
  ctx.origin.behave('big.bin', { rate: undefined });
  await waitFor('the file verified through the new service', () => watch.model.row('big')?.state === 'present', { timeout: 30_000 });
  assert.equal(watch.model.connection.state, 'live');
  assert.ok(states.includes('lost'), `states: ${states.join(' ')}`);
  assert.equal(watch.model.row('big').text, 'Downloaded and verified');
});

test('a status row between two tries reads as a download that is retrying, and why', () => {
  const model = new GemPageModel('notes');
  const row = { ...statusRow({ id: 'model', sha256: SHA_A, required: true }), state: 'retrying', attempt: 3, of: 6, reason: 'connection refused', bytes: 1024 * 1024 };
  model.reset({ gems: notes([row]) });
  const [a] = model.rows;
  assert.equal(a.state, 'downloading');
  assert.equal(a.bytes, 1024 * 1024);
  assert.match(a.text, /retrying \(attempt 3 of 6\): connection refused/);
});

test('a failed row says what it kept and when the service tries it again, from the event and from a status row', () => {
  const model = new GemPageModel('notes');
  model.reset(notes());
  model.apply(file('progress', { bytes: 34 * 1024 * 1024, size: 200 * 1024 * 1024, address: 'https://cdn.test:8443/model.bin', bytes_per_sec: 4096, eta_secs: 700 }));
  const soon = new Date(Date.now() + 10 * 60 * 1000);
  soon.setSeconds(0, 0);
  const next = soon.toISOString();
  model.apply(file('failed', { code: 'E_RESOURCE_UNAVAILABLE', primary_cause: 'E_RESOURCE_POLICY', message: POLICY_MESSAGE, next_try: next }));
  const row = model.row('model');
  assert.equal(row.nextTry, next);
  assert.equal(row.partialBytes, 34 * 1024 * 1024);
  const clock = formatClock(next);
  assert.match(clock, /^(at|tomorrow at) \d\d:\d\d$/);
  assert.ok(row.text.endsWith(`. 34.0 MiB of 200.0 MiB kept; tries again ${clock}`), row.text);
  // The same from a status row.
  const fromStatus = new GemPageModel('notes');
  fromStatus.reset(notes([statusRow({ id: 'model', sha256: SHA_A, size: 200 * 1024 * 1024, state: 'failed', code: 'E_RESOURCE_UNAVAILABLE', primary_cause: 'E_RESOURCE_POLICY', message: POLICY_MESSAGE, partial_bytes: 34 * 1024 * 1024, next_try: next })]));
  assert.equal(fromStatus.row('model').text, row.text);
  // Queued again: no next try any more.
  model.apply(file('queued', { size: 200 * 1024 * 1024 }));
  assert.equal(model.row('model').nextTry, null);
  // A clock another day says which.
  const now = new Date(2026, 11, 5, 23, 50);
  assert.equal(formatClock(new Date(2026, 11, 5, 23, 59).toISOString(), now), 'at 23:59');
  assert.equal(formatClock(new Date(2026, 11, 6, 0, 9).toISOString(), now), 'tomorrow at 00:09');
  assert.equal(formatClock(new Date(2026, 11, 8, 7, 38).toISOString(), now), 'on 2026-12-08 at 07:38');
});
