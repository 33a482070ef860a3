// A client that survives the service restarting: `connect({wait})` waits
// for a service to appear; a client of a store finds the next service by
// itself, checks it as it checked the first (its own pid and secret), says
// so ('disconnected', 'reconnected'), and its subscriptions subscribe again
// and yield `resubscribed`; a call cut off by the service going away, and
// one that waited in vain for the next, reject with E_RESOURCE_SERVICE.

import assert from 'node:assert/strict';
import crypto from 'node:crypto';
import fs from 'node:fs';
import path from 'node:path';
import { once } from 'node:events';
import { test } from 'node:test';

import { connect, E_RESOURCE_SERVICE } from '../index.js';
import { FakeService, Fixture, helloProof, RFC3339_MS, waitFor, within } from './fixture.js';

const NONCE = /^[0-9a-f]{64}$/;

/** The error `promise` rejects with (failing if it resolves, or takes over `ms`). */
function rejection(promise, what, ms = 15_000) {
  return within(ms, promise, what).then(
    (value) => {
      if (value && typeof value.close === 'function') value.close();
      assert.fail(`${what} resolved`);
    },
    (e) => e,
  );
}

/** Stops the fixture's service with `signal` (its clients left alone) and waits for its exit. */
async function kill(ctx, signal) {
  const service = ctx.service;
  service.child.kill(signal);
  const exit = await within(10_000, service.exited, `the exit of the service after ${signal}`);
  assert.equal(exit.signal ?? 'SIGTERM', signal === 'SIGKILL' ? 'SIGKILL' : 'SIGTERM', JSON.stringify(exit));
  return service;
}

/** A client of the fixture's store with `options`, closed when `t` ends. */
async function client(t, ctx, options = {}) {
  const c = await connect({ store: ctx.store, ...options });
  t.after(() => c.close());
  return c;
}

/** The next item of `sub`, within `ms`. */
async function next(sub, what, ms = 15_000) {
  const { value, done } = await within(ms, sub.next(), what);
  assert.equal(done, false, `${what}: the iteration ended`);
  return value;
}

/** Stops a stand-in as a killed service would: its connections cut, its socket gone, its service.json left behind. */
async function vanish(fake) {
  for (const c of fake.connections) c.socket.destroy();
  await new Promise((resolve) => fake.server.close(() => resolve()));
}

test('connect({wait}) waits for a service that starts later; without wait it says at once, in the app\'s name, that none runs', { timeout: 60_000 }, async (t) => {
  const ctx = await Fixture.start(t, { serve: false });
  // A mistyped store is said to be one, as the command line says it.
  const typo = await rejection(connect({ store: `${ctx.store}-typo`, appName: 'Notes' }), 'connect to a mistyped store');
  assert.equal(typo.code, E_RESOURCE_SERVICE, typo.message);
  assert.match(typo.message, /^no store at .*-typo \(nothing was ever installed there and no service runs on it; check the store given to connect, or start Notes, which makes it\)$/);
  // The store is there, its service not.
  fs.mkdirSync(path.join(ctx.store, 'store-v1'), { recursive: true, mode: 0o700 });
  const started = Date.now();
  const now = await rejection(connect({ store: ctx.store, appName: 'Notes' }), 'connect without wait');
  assert.ok(Date.now() - started < 2000, `connect without wait took ${Date.now() - started} ms`);
  assert.equal(now.code, E_RESOURCE_SERVICE, now.message);
  assert.match(now.message, /^Notes's resource service is not running: start Notes \(nothing listens on the store /);
  assert.ok(now.message.includes(ctx.store), now.message);
  const anonymous = await rejection(connect({ store: ctx.store }), 'connect without wait nor app');
  assert.match(anonymous.message, /^The resource service is not running: nothing listens on the store /);

  const waiting = connect({ store: ctx.store, wait: 20_000, appName: 'Notes' });
  let settled = false;
  waiting.then(
    () => (settled = true),
    () => (settled = true),
  );
  // Not given up while nothing listens (the service starts after a while).
  await new Promise((resolve) => setTimeout(resolve, 300));
  assert.equal(settled, false, 'connect({wait}) gave up while the wait ran');
  const service = await ctx.startService();
  const c = await within(15_000, waiting, 'connect({wait}) once the service listens');
  t.after(() => c.close());
  assert.equal(c.service.pid, service.pid);
  assert.equal((await c.status()).service.pid, service.pid);
  t.diagnostic(`connected ${Date.now() - started} ms after the first try`);
});

test('connect({wait}) that sees no service within its bound rejects with E_RESOURCE_SERVICE, saying how long it waited', { timeout: 30_000 }, async (t) => {
  const ctx = await Fixture.start(t, { serve: false });
  fs.mkdirSync(path.join(ctx.store, 'store-v1'), { recursive: true, mode: 0o700 });
  const started = Date.now();
  const error = await rejection(connect({ store: ctx.store, wait: 400 }), 'connect({wait: 400}) with no service');
  const waited = Date.now() - started;
  assert.equal(error.code, E_RESOURCE_SERVICE, error.message);
  assert.match(error.message, /is not running.*\(waited 0\.4 s\)$/);
  assert.ok(waited >= 350 && waited < 5000, `gave up after ${waited} ms`);
  await assert.rejects(connect({ store: ctx.store, wait: -1 }), TypeError);
  await assert.rejects(connect({ store: ctx.store, reconnect: Number.NaN }), TypeError);
});

for (const signal of ['SIGTERM', 'SIGKILL']) {
  test(`a client survives the service restarting after ${signal}: it says so, checks the new service, and its calls go on`, { timeout: 60_000 }, async (t) => {
    const ctx = await Fixture.start(t);
    const c = await client(t, ctx);
    const first = ctx.service.pid;
    assert.equal((await c.status()).service.pid, first);
    const notices = [];
    c.on('disconnected', (e) => notices.push(['disconnected', e]));
    c.on('reconnected', (r) => notices.push(['reconnected', r]));
    const reconnected = once(c, 'reconnected');

    await kill(ctx, signal);
    await waitFor('the client to say it lost the service', () => notices.length > 0);
    assert.equal(notices[0][0], 'disconnected');
    assert.equal(notices[0][1].code, E_RESOURCE_SERVICE);
    // A call made while no service runs waits for the next one.
    const during = c.status();
    const service = await ctx.startService();
    assert.notEqual(service.pid, first);

    const [{ service: hello, previous }] = await within(15_000, reconnected, 'the reconnected event');
    assert.equal(previous.pid, first);
    assert.equal(hello.pid, service.pid);
    assert.match(hello.proof, NONCE, 'the new service was not asked to prove its secret');
    assert.equal(c.service.pid, service.pid);
    assert.equal((await within(15_000, during, 'the status asked while no service ran')).service.pid, service.pid);
    assert.equal((await c.status()).service.pid, service.pid);
    assert.equal((await c.hello()).pid, service.pid);
    const sub = await c.subscribe();
    sub.close();
    assert.deepEqual(notices.map(([what]) => what), ['disconnected', 'reconnected']);
  });
}

test('a subscription survives a restart: it subscribes again, yields resubscribed with the new status, then the new service\'s events', { timeout: 60_000 }, async (t) => {
  const ctx = await Fixture.start(t);
  const a = ctx.origin.add('a.bin', { size: 32 * 1024 });
  const b = ctx.origin.add('b.bin', { size: 16 * 1024 });
  const c = await client(t, ctx);
  await ctx.installGem('notes', [ctx.resource(a, { id: 'a' })], c);
  const sub = await c.forGem('notes').subscribe();
  t.after(() => sub.close());
  assert.equal(sub.status[0].resources[0].state, 'missing');
  const firstId = sub.id;

  await kill(ctx, 'SIGKILL');
  // While no service runs, the command line fetches the file in process:
  // the status the new service gives differs from the one of the subscription.
  const fetched = await ctx.cli(['path', 'notes', 'a']);
  assert.equal(fetched.code, 0, fetched.stderr);
  await ctx.startService();

  const before = Date.now();
  const item = await next(sub, 'the resubscribed item');
  assert.deepEqual(Object.keys(item).sort(), ['at', 'event', 'reason', 'status']);
  assert.equal(item.event, 'resubscribed');
  assert.equal(item.reason, 'service restarted');
  assert.match(item.at, RFC3339_MS);
  assert.ok(Math.abs(Date.parse(item.at) - before) < 15_000, item.at);
  const row = item.status.find((g) => g.gem === 'notes').resources.find((r) => r.id === 'a');
  assert.equal(row.state, 'present', JSON.stringify(row));
  assert.deepEqual(sub.status, item.status);
  assert.equal(typeof sub.id, 'number');
  t.diagnostic(`subscription ${firstId} became ${sub.id}`);

  // The new service's events follow (its scan of the gems folder may say
  // `installed` of the first manifest too).
  await ctx.installGem('notes', [ctx.resource(a, { id: 'a' }), ctx.resource(b, { id: 'b' })], c);
  for (;;) {
    const event = await next(sub, 'the installed event of the new manifest');
    assert.notEqual(event.event, 'resubscribed');
    if (event.event === 'installed' && event.resources.some((r) => r.id === 'b')) break;
  }
});

test('a path pending when the service stops rejects with E_RESOURCE_SERVICE, worded for the tool\'s user; called again, it is answered by the next service', { timeout: 60_000 }, async (t) => {
  const ctx = await Fixture.start(t);
  const held = ctx.origin.add('held.bin', { size: 64 * 1024 });
  ctx.origin.behave('held.bin', { hold: true });
  const c = await client(t, ctx, { appName: 'Notes' });
  await ctx.installGem('notes', [ctx.resource(held, { id: 'held' })], c);
  const progress = [];
  const pending = c.path('notes', 'held', { onProgress: (e) => progress.push(e.event) }).then(
    () => assert.fail('the path resolved although its file never came'),
    (e) => e,
  );
  await waitFor('the held download to connect', () => ctx.origin.activeResponses('held.bin') === 1);

  await kill(ctx, 'SIGTERM');
  const error = await within(5000, pending, 'the path pending at the stop');
  t.diagnostic(`${error.code}: ${error.message} (cause: ${error.cause?.code}: ${error.cause?.message})`);
  assert.equal(error.code, E_RESOURCE_SERVICE, error.message);
  assert.match(error.message, /^Notes's resource service went away before it answered `path` \(.*\); try again once it is back$/);
  assert.ok(progress.includes('started'), progress.join(', '));

  await ctx.startService();
  ctx.origin.behave('held.bin', { hold: false });
  const again = [];
  const { path } = await within(20_000, c.path('notes', 'held', { onProgress: (e) => again.push(e.event) }), 'the path called again');
  assert.ok(path.length > 0);
  assert.equal(again.at(-1), 'verified', again.join(', '));
});

test('a call the service cuts off is not sent again: E_RESOURCE_SERVICE, with E_RESOURCE_SHUTDOWN as its cause when the service said so', { timeout: 30_000 }, async (t) => {
  const received = [];
  const fake = await FakeService.start(t, (req) => {
    received.push(req.method);
    if (req.method === 'hello') return fake.hello(req);
    if (req.method === 'install') return undefined; // held
    if (req.method === 'set_policy') {
      const data = { code: 'E_RESOURCE_SHUTDOWN', primary_cause: 'E_RESOURCE_SHUTDOWN', message: 'the resource service was shut down; open it again to continue' };
      return { error: { code: -32000, message: data.message, data } };
    }
    return {};
  });
  fake.writeServiceFile();
  const c = await connect({ store: fake.store, reconnect: 10_000 });
  t.after(() => c.close());
  const install = c.install('notes', { resources: [] });
  await waitFor('the install to arrive', () => received.includes('install'));
  const disconnected = once(c, 'disconnected');
  const policy = await rejection(c.setPolicy({ mode: 'blocklist', hosts: [] }), 'set_policy of a service shut down');
  assert.equal(policy.code, E_RESOURCE_SERVICE, policy.message);
  assert.match(policy.message, /went away before it answered `set_policy` \(.*is shutting down\); whether it was done is not known/);
  assert.equal(policy.cause?.code, 'E_RESOURCE_SHUTDOWN');
  const cut = await rejection(install, 'the install in flight');
  assert.equal(cut.code, E_RESOURCE_SERVICE, cut.message);
  assert.match(cut.message, /went away before it answered `install`.*whether it was done is not known/);
  await disconnected;

  // The next service (the first one said it stops: it is not taken back).
  const next = await FakeService.start(t, (req) => {
    if (req.method === 'hello') return next.hello(req);
    return { from: 'the next service', method: req.method };
  });
  next.store = fake.store;
  next.writeServiceFile();
  const [{ service }] = await within(15_000, once(c, 'reconnected'), 'the reconnected event');
  assert.equal(service.proof, helloProof(next.secret, next.connections[0].requests[0].params.nonce));
  assert.deepEqual(await c.status(), { from: 'the next service', method: 'status' });
  const methods = next.connections.flatMap((conn) => conn.requests.map((r) => r.method));
  assert.deepEqual(methods, ['hello', 'status'], 'a call was sent again to the next service');
});

test('with no service back within `reconnect`, waiting calls and subscriptions end with E_RESOURCE_SERVICE; a later call finds the next service', { timeout: 60_000 }, async (t) => {
  const ctx = await Fixture.start(t);
  const c = await client(t, ctx, { reconnect: 1000, appName: 'Notes' });
  const sub = await c.subscribe();
  t.after(() => sub.close());
  const disconnected = once(c, 'disconnected');
  await kill(ctx, 'SIGKILL');
  await within(5000, disconnected, 'the disconnected event');
  const started = Date.now();
  const error = await rejection(c.status(), 'status with no service coming back');
  const waited = Date.now() - started;
  assert.equal(error.code, E_RESOURCE_SERVICE, error.message);
  assert.match(error.message, /^no answer: Notes's resource service went away \(.*\) and none came back within 1 s \(last try: .*\)$/);
  assert.ok(waited < 8000, `status waited ${waited} ms`);

  const ended = await rejection((async () => {
    for await (const event of sub) assert.fail(`an event after the service went away: ${JSON.stringify(event)}`);
  })(), 'the subscription');
  assert.equal(ended.code, E_RESOURCE_SERVICE, ended.message);
  assert.match(ended.message, /^the subscription ended: Notes's resource service went away \(.*\) and none came back within 1 s/);

  // The search is over: a call says at once that no service runs.
  const now = Date.now();
  const later = await rejection(c.status(), 'status after the search');
  assert.equal(later.code, E_RESOURCE_SERVICE, later.message);
  assert.match(later.message, /its service\.json is stale .*; Notes's resource service is not running: start Notes$/);
  assert.ok(Date.now() - now < 2000, `took ${Date.now() - now} ms`);

  // A service starts: the next call reaches it.
  const service = await ctx.startService();
  const reconnected = once(c, 'reconnected');
  assert.equal((await c.status()).service.pid, service.pid);
  assert.equal((await reconnected)[0].service.pid, service.pid);
});

test('a service that appears at the restart without proving the new secret gets hello alone; the true next service is taken', { timeout: 60_000 }, async (t) => {
  const first = await FakeService.start(t, (req, conn) => {
    if (req.method === 'hello') return first.hello(req);
    if (req.method === 'subscribe') return { subscription: 1, status: [] };
    return { from: 'first', conn: first.connections.indexOf(conn) };
  });
  first.writeServiceFile();
  const c = await connect({ store: first.store, reconnect: 1500 });
  t.after(() => c.close());
  const sub = await c.subscribe();
  t.after(() => sub.close());
  assert.equal((await c.status()).from, 'first');

  // The service goes; another process writes a service.json of its own and
  // proves, to each nonce, the secret of the service that went (which it
  // knows), or one it made up; never the secret of the file it wrote.
  const forged = [];
  const impostor = await FakeService.start(t, (req) => {
    if (req.method !== 'hello') return { from: 'the impostor' };
    const hello = impostor.hello(req);
    const secret = forged.length % 2 === 0 ? first.secret : crypto.randomBytes(32).toString('hex');
    forged.push(req.params?.nonce);
    return { ...hello, proof: helloProof(secret, req.params?.nonce ?? '') };
  });
  impostor.store = first.store;
  const disconnected = once(c, 'disconnected');
  await vanish(first);
  await within(5000, disconnected, 'the disconnected event');
  impostor.writeServiceFile();

  const error = await rejection(c.status(), 'status while only the impostor listens');
  assert.equal(error.code, E_RESOURCE_SERVICE, error.message);
  assert.match(error.message, /did not prove that it holds the store's secret/);
  const ended = await rejection(sub.next(), 'the subscription while only the impostor listens');
  assert.equal(ended.code, E_RESOURCE_SERVICE, ended.message);
  assert.match(ended.message, /^the subscription ended: .*did not prove that it holds the store's secret/);
  assert.ok(impostor.connections.length >= 2, `${impostor.connections.length} connections to the impostor`);
  for (const conn of impostor.connections) {
    await waitFor('the client to close its connection to the impostor', () => conn.closed);
    assert.deepEqual(conn.requests.map((r) => r.method), ['hello'], `the impostor got ${JSON.stringify(conn.lines)}`);
    assert.match(conn.requests[0].params.nonce, NONCE);
  }
  assert.equal(new Set(forged).size, forged.length, 'a nonce was used twice');

  // The true next service: its own secret, written in its own service.json.
  const next = await FakeService.start(t, (req) => (req.method === 'hello' ? next.hello(req) : { from: 'next' }));
  next.store = first.store;
  next.writeServiceFile();
  assert.equal((await c.status()).from, 'next');
  assert.equal(c.service.proof, helloProof(next.secret, next.connections[0].requests[0].params.nonce));
});
