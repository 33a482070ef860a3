// One call: its own progress (`onProgress`, `pull`) and its cancellation
// (an AbortSignal, leaving a `pull` loop early), against the real service
// and, for what a client sends, against a stand-in.

import assert from 'node:assert/strict';
import fs from 'node:fs';
import { test } from 'node:test';

import { connect, E_RESOURCE_CANCELLED } from '../index.js';
import { FakeService, Fixture, sha256, sleep, waitFor, within } from './fixture.js';

/** The kinds of `events`, runs of `progress` shown once. */
function compact(events) {
  const kinds = events.map((e) => e.event);
  return kinds.filter((k, i) => k !== 'progress' || kinds[i - 1] !== 'progress');
}

/** The error `promise` rejects with (failing if it resolves). */
function rejection(promise, what, ms = 10_000) {
  return within(ms, promise, what).then(
    (value) => assert.fail(`${what} resolved: ${JSON.stringify(value)}`),
    (e) => e,
  );
}

/** Waits until the origin sends no more bytes of `name`: no response under way, and none sent for `quiet` ms. */
async function originStopped(ctx, name, quiet = 600) {
  await waitFor(`the origin to stop sending ${name}`, () => ctx.origin.activeResponses(name) === 0, { timeout: 5000 });
  const sent = ctx.origin.bytesSent(name);
  await sleep(quiet);
  assert.equal(ctx.origin.activeResponses(name), 0, `a new request for ${name} began`);
  assert.equal(ctx.origin.bytesSent(name), sent, `the origin went on sending ${name}`);
  return sent;
}

/** The status row of `gem`'s resource `id`. */
async function row(client, gem, id) {
  const status = await client.status(gem);
  return status.gems.find((g) => g.gem === gem).resources.find((r) => r.id === id);
}

test('path with onProgress gets the events of its own resource, from queued to verified, before it resolves', { timeout: 30_000 }, async (t) => {
  const ctx = await Fixture.start(t);
  const a = ctx.origin.add('a.bin', { size: 512 * 1024 });
  const b = ctx.origin.add('b.bin', { size: 512 * 1024 });
  ctx.origin.behave('a.bin', { rate: 1024 * 1024 }); // about half a second: several progress steps
  ctx.origin.behave('b.bin', { rate: 384 * 1024 }); // still downloading when `a` is done
  const client = await ctx.connect();
  await ctx.installGem('notes', [ctx.resource(a, { id: 'a' }), ctx.resource(b, { id: 'b' })], client);

  // The other lazy file downloads all along, for another call of the same client.
  const otherEvents = [];
  const otherCall = client.path('notes', 'b', { onProgress: (event) => otherEvents.push(event) });
  await waitFor('the download of b', () => ctx.origin.activeResponses('b.bin') > 0);

  const events = [];
  let settled = false;
  let lateEvents = 0;
  const answer = await client.path('notes', 'a', {
    onProgress: (event) => {
      if (settled) lateEvents += 1;
      events.push(event);
    },
  });
  settled = true;
  assert.ok(ctx.origin.activeResponses('b.bin') > 0, 'b was no longer downloading while a downloaded');

  assert.deepEqual(
    events.filter((e) => e.gem !== 'notes' || e.resource !== 'a').map((e) => `${e.event} ${e.resource}`),
    [],
    'events of another resource',
  );
  assert.deepEqual(compact(events), ['queued', 'started', 'progress', 'verified'], `events: ${events.map((e) => e.event).join(' ')}`);
  assert.equal(events[0].event, 'queued');
  assert.ok(events.some((e) => e.event === 'progress' && e.bytes > 0 && e.size === a.size));
  const last = events.at(-1);
  assert.equal(last.event, 'verified');
  assert.equal(last.path, answer.path);
  assert.equal(last.sha256, a.sha256);
  assert.equal(answer.resource, 'a');
  assert.equal(sha256(fs.readFileSync(answer.path)), a.sha256);

  // Nothing after the answer.
  const bAnswer = await otherCall;
  await sleep(200);
  assert.equal(lateEvents, 0, 'events after the promise resolved');
  assert.equal(events.length, events.indexOf(last) + 1);
  assert.equal(sha256(fs.readFileSync(bAnswer.path)), b.sha256);
  assert.ok(otherEvents.length > 0 && otherEvents.every((e) => e.resource === 'b'), `b's events: ${otherEvents.map((e) => `${e.event} ${e.resource}`).join(', ')}`);
  assert.equal(otherEvents.at(-1).event, 'verified');
});

test('pull yields the call\'s own events, then the path', { timeout: 30_000 }, async (t) => {
  const ctx = await Fixture.start(t);
  const file = ctx.origin.add('model.bin', { size: 512 * 1024 });
  ctx.origin.behave('model.bin', { rate: 1024 * 1024 });
  const client = await ctx.connect();
  await ctx.installGem('notes', [ctx.resource(file, { id: 'model' })], client);
  const resources = client.forGem('notes');

  const items = [];
  for await (const item of resources.pull('model')) items.push(item);

  const final = items.at(-1);
  assert.equal(final.event, 'path');
  assert.equal(final.gem, 'notes');
  assert.equal(final.resource, 'model');
  assert.equal(sha256(fs.readFileSync(final.path)), file.sha256);
  const events = items.slice(0, -1);
  assert.deepEqual(compact(events), ['queued', 'started', 'progress', 'verified'], `items: ${items.map((e) => e.event).join(' ')}`);
  assert.ok(events.every((e) => e.resource === 'model' && e.sha256 === file.sha256));
  assert.equal(events.at(-1).path, final.path);

  // Asked again: the file is present, so the path alone.
  const again = [];
  for await (const item of resources.pull('model')) again.push(item);
  assert.deepEqual(again, [{ event: 'path', gem: 'notes', resource: 'model', path: final.path }]);
  assert.equal(ctx.origin.requestCount('model.bin'), 1);
});

test('leaving a pull loop early cancels the call: the origin stops sending and the file is not downloading', { timeout: 30_000 }, async (t) => {
  const ctx = await Fixture.start(t);
  const file = ctx.origin.add('slow.bin', { size: 2 * 1024 * 1024 });
  ctx.origin.behave('slow.bin', { rate: 128 * 1024 }); // 16 s
  const client = await ctx.connect();
  await ctx.installGem('notes', [ctx.resource(file, { id: 'slow' })], client);

  const seen = [];
  for await (const event of client.pull('notes', 'slow')) {
    seen.push(event.event);
    if (event.event === 'progress' && event.bytes > 0) break;
  }
  assert.equal(seen[0], 'queued');
  assert.ok(!seen.includes('path'));

  const sent = await originStopped(ctx, 'slow.bin');
  assert.ok(sent < file.size, `the origin sent the whole file (${sent} bytes)`);
  const r = await row(client, 'notes', 'slow');
  assert.notEqual(r.state, 'downloading', JSON.stringify(r));
  assert.notEqual(r.state, 'present', JSON.stringify(r));
  // The connection is still usable.
  assert.equal((await client.hello()).protocol, 1);
});

test('aborting a slow path rejects at once with E_RESOURCE_CANCELLED, and the download stops when nobody else waits', { timeout: 30_000 }, async (t) => {
  const ctx = await Fixture.start(t);
  const file = ctx.origin.add('slow.bin', { size: 2 * 1024 * 1024 });
  ctx.origin.behave('slow.bin', { rate: 128 * 1024 });
  const client = await ctx.connect();
  await ctx.installGem('notes', [ctx.resource(file, { id: 'slow' })], client);

  const controller = new AbortController();
  const call = client.path('notes', 'slow', { signal: controller.signal });
  call.catch(() => {});
  await waitFor('the download to send bytes', () => ctx.origin.bytesSent('slow.bin') > 0);

  const abortedAt = Date.now();
  controller.abort();
  const error = await rejection(call, 'the aborted path', 2000);
  const took = Date.now() - abortedAt;
  assert.ok(took < 200, `rejected ${took} ms after abort`);
  assert.equal(error.name, 'ResourceError');
  assert.equal(error.code, E_RESOURCE_CANCELLED);
  assert.equal(error.aborted, true);
  assert.equal(error.cause, controller.signal.reason);
  assert.equal(await within(6000, error.downloadOutcome, 'downloadOutcome'), 'stopped');
  assert.equal(error.download, 'stopped');

  const sent = await originStopped(ctx, 'slow.bin');
  assert.ok(sent < file.size, `the origin sent the whole file (${sent} bytes)`);
  const r = await row(client, 'notes', 'slow');
  assert.notEqual(r.state, 'downloading', JSON.stringify(r));
  assert.notEqual(r.state, 'present', JSON.stringify(r));

  // A later call resumes and completes.
  ctx.origin.behave('slow.bin', { rate: undefined });
  const { path } = await client.path('notes', 'slow');
  assert.equal(sha256(fs.readFileSync(path)), file.sha256);
});

test('aborting one of two callers of the same file: the download continues for the other, and the first learns it', { timeout: 30_000 }, async (t) => {
  const ctx = await Fixture.start(t);
  const file = ctx.origin.add('shared.bin', { size: 1024 * 1024 });
  ctx.origin.behave('shared.bin', { rate: 512 * 1024 }); // 2 s
  const first = await ctx.connect();
  const second = await ctx.connect();
  await ctx.installGem('notes', [ctx.resource(file, { id: 'shared' })], first);

  // Each call is known to the service once it has had an event of its own.
  let secondHeard = false;
  const secondCall = second.path('notes', 'shared', { onProgress: () => (secondHeard = true) });
  await waitFor('the second caller\'s first event', () => secondHeard);
  const controller = new AbortController();
  let firstProgress = 0;
  const firstCall = first.path('notes', 'shared', {
    signal: controller.signal,
    onProgress: (e) => (firstProgress += e.event === 'progress' ? 1 : 0),
  });
  firstCall.catch(() => {});
  await waitFor('a progress event of the first caller', () => firstProgress > 0);
  const requests = ctx.origin.requestCount('shared.bin');

  const abortedAt = Date.now();
  controller.abort();
  const error = await rejection(firstCall, 'the aborted path', 2000);
  const took = Date.now() - abortedAt;
  assert.ok(took < 200, `rejected ${took} ms after abort`);
  assert.equal(error.code, E_RESOURCE_CANCELLED);
  assert.equal(error.aborted, true);
  assert.equal(await within(6000, error.downloadOutcome, 'downloadOutcome'), 'continues');
  assert.equal(error.download, 'continues');
  assert.ok(ctx.origin.activeResponses('shared.bin') > 0, 'the download stopped');

  const { path } = await within(20_000, secondCall, 'the second caller\'s path');
  assert.equal(sha256(fs.readFileSync(path)), file.sha256);
  assert.equal(ctx.origin.requestCount('shared.bin'), requests, 'the download started over');
});

test('an already aborted signal rejects every call without sending anything', { timeout: 30_000 }, async (t) => {
  // A stand-in that answers every call, so a call that was sent resolves.
  const fake = await FakeService.start(t, (req) => {
    switch (req.method) {
      case 'hello':
        return fake.hello(req);
      case 'path':
        return { gem: req.params.gem, resource: req.params.id, path: '/nowhere/model.bin' };
      default:
        return {};
    }
  });
  fake.writeServiceFile();
  const client = await connect({ store: fake.store });
  t.after(() => client.close());
  const [conn] = fake.connections;
  assert.equal(conn.lines.length, 1); // hello

  const reason = new Error('not wanted any more');
  const signal = AbortSignal.abort(reason);
  const manifest = { id: 'notes', name: 'notes', version: '1.0.0', resources: [] };
  const resources = client.forGem('notes');
  const calls = {
    path: () => client.path('notes', 'model', { signal }),
    'path with onProgress': () => client.path('notes', 'model', { signal, onProgress: () => {} }),
    install: () => client.install('notes', manifest, { signal }),
    autofill: () => client.autofill('https://cdn.test/model.bin', { signal }),
    autofillManifest: () => client.autofillManifest(manifest, { all: true, signal }),
    'GemResources.path': () => resources.path('model', { signal }),
    'GemResources.pull': async () => {
      for await (const item of resources.pull('model', { signal })) assert.fail(`pull yielded ${JSON.stringify(item)}`);
    },
  };
  for (const [name, call] of Object.entries(calls)) {
    const error = await rejection(call(), name, 2000);
    assert.equal(error.code, E_RESOURCE_CANCELLED, `${name}: ${error.message}`);
    assert.equal(error.aborted, true, name);
    assert.equal(error.cause, reason, name);
    assert.equal(await error.downloadOutcome, 'unknown', name);
  }
  await sleep(100);
  assert.deepEqual(conn.lines.slice(1), [], 'lines sent after hello');
  // The same client still works.
  assert.equal((await client.path('notes', 'model')).path, '/nowhere/model.bin');
});

test('abort sends $/cancelRequest for path and autofill and nothing for install; the answer tells the download', { timeout: 30_000 }, async (t) => {
  const fake = await FakeService.start(t, (req) => (req.method === 'hello' ? fake.hello(req) : undefined));
  fake.writeServiceFile();
  const client = await connect({ store: fake.store });
  t.after(() => client.close());
  const [conn] = fake.connections;
  const answerCancel = (id, data) => {
    const error = { code: -32800, message: 'the call was cancelled', data: { code: E_RESOURCE_CANCELLED, primary_cause: E_RESOURCE_CANCELLED, message: 'cancelled', ...data } };
    conn.socket.write(JSON.stringify({ jsonrpc: '2.0', id, error }) + '\n');
  };
  const sentRequest = (method) => waitFor(`the ${method} request`, () => conn.requests.find((r) => r.method === method && !r.seen && (r.seen = true)));

  // path: rejected at once, `$/cancelRequest` (a notification) names its id; the answer fills `download`.
  const pathAbort = new AbortController();
  const path = client.path('notes', 'model', { signal: pathAbort.signal });
  const pathRequest = await sentRequest('path');
  pathAbort.abort();
  const pathError = await rejection(path, 'path', 200);
  assert.equal(pathError.code, E_RESOURCE_CANCELLED);
  assert.equal(pathError.download, undefined);
  const cancel = await sentRequest('$/cancelRequest');
  assert.equal('id' in cancel, false, 'a $/cancelRequest with an id: it is a notification');
  assert.deepEqual(cancel.params, { id: pathRequest.id });
  answerCancel(pathRequest.id, { resource: 'model', download: 'continues' });
  assert.equal(await within(2000, pathError.downloadOutcome, 'downloadOutcome'), 'continues');
  assert.equal(pathError.download, 'continues');

  // autofill: the same.
  const autofillAbort = new AbortController();
  const autofill = client.autofill('https://cdn.test/model.bin', { signal: autofillAbort.signal });
  const autofillRequest = await sentRequest('autofill');
  autofillAbort.abort();
  const autofillError = await rejection(autofill, 'autofill', 200);
  assert.equal(autofillError.code, E_RESOURCE_CANCELLED);
  const cancel2 = await sentRequest('$/cancelRequest');
  assert.deepEqual(cancel2.params, { id: autofillRequest.id });
  answerCancel(autofillRequest.id, {});
  assert.equal(await within(2000, autofillError.downloadOutcome, 'downloadOutcome'), 'stopped');

  // onProgress throwing: the call is cancelled and rejects with what it threw.
  const thrown = new Error('the tool gave up');
  const progressed = client.path('notes', 'other', {
    onProgress: () => {
      throw thrown;
    },
  });
  const progressRequest = await sentRequest('path');
  assert.equal(typeof progressRequest.params.progress, 'string');
  conn.socket.write(JSON.stringify({ jsonrpc: '2.0', method: '$/progress', params: { token: progressRequest.params.progress, value: { event: 'queued', gem: 'notes', resource: 'other' } } }) + '\n');
  assert.equal(await rejection(progressed, 'path whose onProgress threw', 1000), thrown);
  assert.deepEqual((await sentRequest('$/cancelRequest')).params, { id: progressRequest.id });

  // install: only no longer waited for.
  const installAbort = new AbortController();
  const install = client.install('notes', { id: 'notes', resources: [] }, { signal: installAbort.signal });
  await sentRequest('install');
  installAbort.abort();
  const installError = await rejection(install, 'install', 200);
  assert.equal(installError.code, E_RESOURCE_CANCELLED);
  assert.equal(await installError.downloadOutcome, 'unknown');
  await sleep(200);
  assert.deepEqual(conn.requests.filter((r) => !r.seen && r.method !== 'hello').map((r) => r.method), [], 'sent after install was aborted');
});
