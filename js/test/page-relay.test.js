// The relay (js/page/relay.js) over HTTP from Node: a link's token is good
// once and becomes an HttpOnly, SameSite=Strict cookie; event streams are
// capped per client and in all; one relay feeds several gems; a service
// that goes away is said at once, and while it is away the feeds answer
// 503 with the reason; when it is back the feeds work again.

import assert from 'node:assert/strict';
import { EventEmitter } from 'node:events';
import { test } from 'node:test';

import { connect } from '../index.js';
import { MAX_STREAMS, MAX_STREAMS_PER_CLIENT, startRelay } from '../page/relay.js';

import { Fixture, waitFor, within } from './fixture.js';
import { FakeSource, eventStream, request, signIn, statusRow } from './page-fixture.js';

const MiB = 1024 * 1024;

function fakeStatus() {
  return {
    gems: [
      { gem: 'notes', installed_by: { kind: 'api' }, resources: [statusRow({ id: 'model' })] },
      { gem: 'letters', installed_by: { kind: 'api' }, resources: [statusRow({ id: 'font' })] },
    ],
  };
}

/** A source whose subscriptions open at once with the fake status. */
class OpenSource extends FakeSource {
  subscribe(options) {
    const opened = super.subscribe(options);
    this.subscriptions.at(-1).open(fakeStatus().gems.filter((g) => g.gem === options.gem));
    return opened;
  }
}

test('a link’s token is good once: it becomes an HttpOnly, SameSite=Strict cookie and a redirect without it; used again it is refused', { timeout: 20_000 }, async (t) => {
  const relay = await startRelay({ source: new FakeSource({ status: fakeStatus() }), gem: 'notes' });
  t.after(() => relay.close());
  const host = `127.0.0.1:${relay.port}`;
  const link = new URL(relay.pageUrl);
  assert.equal(link.searchParams.get('token'), relay.token);

  const first = await request(relay.port, `${link.pathname}${link.search}`, { headers: { host } });
  assert.equal(first.status, 302);
  assert.equal(first.headers.location, '/page/index.html?gem=notes', 'the same path, without the token');
  const setCookie = first.headers['set-cookie'];
  assert.equal(setCookie.length, 1);
  const flags = setCookie[0].split(';').map((f) => f.trim());
  assert.match(flags[0], new RegExp(`^gem_relay_${relay.port}=[0-9a-f]{64}$`));
  assert.ok(flags.includes('HttpOnly'), setCookie[0]);
  assert.ok(flags.includes('SameSite=Strict'), setCookie[0]);
  assert.ok(flags.includes('Path=/'), setCookie[0]);
  assert.ok(!flags.some((f) => /^(Max-Age|Expires|Domain)=/i.test(f)), `a session cookie of this host only: ${setCookie[0]}`);
  const cookie = flags[0];

  // Later requests need the cookie, not the token.
  assert.equal((await request(relay.port, '/page/index.html?gem=notes', { headers: { host, cookie } })).status, 200);
  assert.equal((await request(relay.port, '/feed/notes/status', { headers: { host, cookie } })).status, 200);
  assert.equal((await request(relay.port, '/page/index.html?gem=notes', { headers: { host } })).status, 403);

  // The same link again, as another local user who read it with `ps` would: refused, saying why.
  const again = await request(relay.port, `${link.pathname}${link.search}`, { headers: { host } });
  assert.equal(again.status, 403);
  assert.match(again.body, /used already/);
  assert.equal(again.headers['set-cookie'], undefined);
  // The browser that used it, opening it again, is only sent on.
  const own = await request(relay.port, `${link.pathname}${link.search}`, { headers: { host, cookie } });
  assert.equal(own.status, 302);
  assert.equal(own.headers['set-cookie'], undefined);

  // A new link (another gem, another browser) works once too.
  const other = relay.newPageUrl('notes');
  assert.notEqual(new URL(other).searchParams.get('token'), relay.token);
  const second = await signIn(relay, other);
  assert.notEqual(second, cookie);
  await assert.rejects(signIn(relay, other), /answered 403/);
});

test('event streams are capped per client and in all: another client still gets one, and a closed one frees its place', { timeout: 30_000 }, async (t) => {
  const relay = await startRelay({ source: new OpenSource({ status: fakeStatus() }), gems: ['notes'] });
  t.after(() => relay.close());
  const host = `127.0.0.1:${relay.port}`;
  const open = (cookie) => eventStream(relay.port, '/feed/notes/events', { host, cookie });
  const streams = [];
  t.after(() => streams.forEach((s) => s.close()));

  const mine = await signIn(relay, relay.pageUrl);
  for (let i = 0; i < MAX_STREAMS_PER_CLIENT; i++) streams.push(await open(mine));
  const over = await request(relay.port, '/feed/notes/events', { headers: { host, cookie: mine } });
  assert.equal(over.status, 429, over.body);
  assert.match(JSON.parse(over.body).message, new RegExp(`holds ${MAX_STREAMS_PER_CLIENT} event streams`));

  // Another client is not locked out by the first.
  const clients = [mine];
  while (streams.length < MAX_STREAMS) {
    const cookie = await signIn(relay, relay.newPageUrl());
    clients.push(cookie);
    for (let i = 0; i < MAX_STREAMS_PER_CLIENT && streams.length < MAX_STREAMS; i++) streams.push(await open(cookie));
  }
  const late = await signIn(relay, relay.newPageUrl());
  const full = await request(relay.port, '/feed/notes/events', { headers: { host, cookie: late } });
  assert.equal(full.status, 503, full.body);
  assert.match(JSON.parse(full.body).message, new RegExp(`serves ${MAX_STREAMS} event streams`));

  // One stream of the first client closes: its place is free again.
  streams.shift().close();
  const again = await waitFor('a free place', async () => {
    const r = await request(relay.port, '/feed/notes/events', { headers: { host, cookie: late } });
    return r.status === 200 && r;
  });
  assert.match(again.body, /^event: relay/);
});

test('one relay feeds several gems (or any gem) and nothing else', { timeout: 20_000 }, async (t) => {
  const two = await startRelay({ source: new OpenSource({ status: fakeStatus() }), gems: ['notes', 'letters'] });
  t.after(() => two.close());
  const host = `127.0.0.1:${two.port}`;
  assert.match(two.newPageUrl('letters'), /\/page\/index\.html\?gem=letters&token=/);
  const cookie = await signIn(two, two.newPageUrl('letters'));
  for (const [gem, id] of [['notes', 'model'], ['letters', 'font']]) {
    const status = await request(two.port, `/feed/${gem}/status`, { headers: { host, cookie } });
    assert.equal(status.status, 200, gem);
    assert.deepEqual(JSON.parse(status.body).gems.map((g) => [g.gem, g.resources[0].id]), [[gem, id]]);
    const stream = await eventStream(two.port, `/feed/${gem}/events`, { host, cookie });
    await stream.next((m) => m.event === 'status');
    assert.equal(stream.messages.find((m) => m.event === 'status').data[0].gem, gem);
    stream.close();
  }
  assert.equal((await request(two.port, '/feed/other/status', { headers: { host, cookie } })).status, 404);

  const any = await startRelay({ source: new OpenSource({ status: fakeStatus() }) });
  t.after(() => any.close());
  const anyCookie = await signIn(any, any.newPageUrl('letters'));
  const anyHost = `127.0.0.1:${any.port}`;
  const letters = await request(any.port, '/feed/letters/status', { headers: { host: anyHost, cookie: anyCookie } });
  assert.deepEqual(JSON.parse(letters.body).gems.map((g) => g.gem), ['letters']);
  assert.equal((await request(any.port, '/feed/%0a/status', { headers: { host: anyHost, cookie: anyCookie } })).status, 404);
});

test('a real service killed: the relay’s stream says lost within 2 s; while it is away the feeds answer 503 with the reason; then it is back', { timeout: 90_000 }, async (t) => {
  const ctx = await Fixture.start(t);
  const file = ctx.origin.add('model.onnx', { size: 1 * MiB });
  const client = await ctx.connect();
  await ctx.installGem('notes', [ctx.resource(file, { id: 'ocr' })], client);
  const relay = await startRelay({ source: client, gem: 'notes', appName: 'Notes' });
  t.after(() => relay.close());
  const host = `127.0.0.1:${relay.port}`;
  const cookie = await signIn(relay, relay.pageUrl);
  const stream = await eventStream(relay.port, '/feed/notes/events', { host, cookie });
  t.after(() => stream.close());
  assert.deepEqual((await stream.next()).data, { app: 'Notes', gem: 'notes', actions: [] }, 'read-only unless the app enables actions');
  await stream.next((m) => m.event === 'status');

  const killed = Date.now();
  ctx.service.child.kill('SIGKILL');
  const lost = await stream.next((m) => m.event === 'lost', 5000);
  const took = Date.now() - killed;
  t.diagnostic(`the relay's stream said lost ${took} ms after the kill`);
  assert.ok(took < 2000, `lost after ${took} ms`);
  assert.equal(lost.data.code, 'E_RESOURCE_SERVICE');
  assert.equal(lost.data.app, 'Notes');
  await waitFor('the stream to end', () => stream.ended);

  // A page opened now is told at once why (not after the client's 30 s).
  for (const what of ['status', 'events']) {
    const asked = Date.now();
    const r = await within(2000, request(relay.port, `/feed/notes/${what}`, { headers: { host, cookie } }), `the ${what} feed`);
    t.diagnostic(`${what} answered ${r.status} in ${Date.now() - asked} ms while the service was away`);
    assert.equal(r.status, 503, r.body);
    const reason = JSON.parse(r.body);
    assert.equal(reason.code, 'E_RESOURCE_SERVICE');
    assert.equal(reason.app, 'Notes');
    assert.ok(reason.message.length > 0);
  }

  await ctx.startService();
  const back = await waitFor('the relay to feed again', async () => {
    const r = await request(relay.port, '/feed/notes/status', { headers: { host, cookie } });
    return r.status === 200 && r;
  }, { timeout: 40_000 });
  assert.deepEqual(JSON.parse(back.body).gems.map((g) => g.gem), ['notes']);
  const again = await eventStream(relay.port, '/feed/notes/events', { host, cookie });
  t.after(() => again.close());
  await again.next((m) => m.event === 'status');
});

test('after the client’s reconnect window has passed, the relay tries the service again by itself and feeds once it is back', { timeout: 90_000 }, async (t) => {
  const ctx = await Fixture.start(t);
  const file = ctx.origin.add('model.onnx', { size: 1 * MiB });
  await ctx.installGem('notes', [ctx.resource(file, { id: 'ocr' })]);
  const client = await connect({ store: ctx.store, reconnect: 300 });
  t.after(() => client.close());
  const relay = await startRelay({ source: client, gem: 'notes' });
  t.after(() => relay.close());
  const host = `127.0.0.1:${relay.port}`;
  const cookie = await signIn(relay, relay.pageUrl);
  ctx.service.child.kill('SIGKILL');
  await ctx.service.exited;
  await waitFor('the outage', () => relay.outage !== null);
  // Well past the client's window: no call of a page is needed to look again.
  await new Promise((resolve) => setTimeout(resolve, 1500));
  assert.equal((await request(relay.port, '/feed/notes/status', { headers: { host, cookie } })).status, 503);
  await ctx.startService();
  await waitFor('the relay to see the service back', () => relay.outage === null, { timeout: 20_000 });
  assert.equal((await request(relay.port, '/feed/notes/status', { headers: { host, cookie } })).status, 200);
});

test('a stream still waiting for the service when it goes away is answered 503 with the reason, not left hanging', { timeout: 20_000 }, async (t) => {
  const events = new EventEmitter();
  const source = new FakeSource({ status: fakeStatus() });
  source.on = events.on.bind(events);
  source.off = events.off.bind(events);
  const relay = await startRelay({ source, gem: 'notes', appName: 'Notes' });
  t.after(() => relay.close());
  const host = `127.0.0.1:${relay.port}`;
  const cookie = await signIn(relay, relay.pageUrl);
  const pending = request(relay.port, '/feed/notes/events', { headers: { host, cookie } });
  await within(5000, source.nextSubscription(), 'the relay’s subscription');
  events.emit('disconnected', Object.assign(new Error('the service went away'), { code: 'E_RESOURCE_SERVICE' }));
  const r = await within(2000, pending, 'the answer to the waiting stream');
  assert.equal(r.status, 503);
  assert.deepEqual(JSON.parse(r.body), { code: 'E_RESOURCE_SERVICE', message: 'the service went away', app: 'Notes' });
});
