// The gem page's buttons in headless Chromium: Retry on a failed row,
// Download now on a missing one, Cancel on a download, each calling the
// source's method (the client's retry/downloadNow/cancel); a cancelable
// `gem-resources-action` event lets the app act instead. Through the relay
// the page only watches (a POST is refused, no button shows) unless the app
// enables actions; then the POSTs need the cookie and the relay's own Origin.
// The failed row says what it kept and when it is tried again.

import assert from 'node:assert/strict';
import { test } from 'node:test';

import { startRelay } from '../page/relay.js';

import { within } from './fixture.js';
import { Chromium, FakeSource, findChromium, request, signIn, statusRow } from './page-fixture.js';

const MiB = 1024 * 1024;
const POLICY = 'resource "a": every address failed\n  - E_RESOURCE_POLICY: https://cdn.test/a.bin: host cdn.test is not permitted by the network policy (blocklist mode)';

/** The rows: a failed required file with kept bytes and a next try, a missing one, a download, a present one. */
function rows(nextTry) {
  return [
    statusRow({ id: 'a', required: true, size: 200 * MiB, state: 'failed', code: 'E_RESOURCE_UNAVAILABLE', primary_cause: 'E_RESOURCE_POLICY', message: POLICY, partial_bytes: 34 * MiB, next_try: nextTry }),
    statusRow({ id: 'b' }),
    statusRow({ id: 'c', state: 'downloading', bytes: MiB, bytes_per_sec: 1000 }),
    statusRow({ id: 'd', state: 'present' }),
  ];
}

/** Each row's buttons and state words. */
const READ = `[...document.querySelector('gem-resources-page').shadowRoot.querySelectorAll('tbody tr[data-id]')].map((tr) => ({
  id: tr.dataset.id,
  buttons: [...tr.querySelectorAll('.actions button')].map((b) => b.textContent),
  cell: tr.querySelector('td.state').textContent,
}))`;

const click = (id, action) => `document.querySelector('gem-resources-page').shadowRoot.querySelector('tr[data-id="${id}"] button[data-action="${action}"]').click()`;

function skipWithout(t) {
  const chromium = findChromium();
  if (!chromium) {
    const message = 'Chromium is missing: the page’s actions were NOT tested in a browser (apt-get install chromium, or CHROMIUM=/path)';
    process.stderr.write(`\n*** SKIPPED: ${message}\n\n`);
    t.skip(message);
  }
  return chromium;
}

/** A FakeSource with the client's action methods, recording each call. */
function actingSource() {
  const source = new FakeSource();
  source.calls = [];
  for (const action of ['retry', 'downloadNow', 'cancel']) {
    source[action] = async (gem, id) => {
      source.calls.push([action, gem, id]);
      return { changed: true };
    };
  }
  return source;
}

test('with a client source the buttons call retry, downloadNow and cancel; an app may take an action over; the failed row says what it kept and when it is tried again', { timeout: 60_000 }, async (t) => {
  const chromium = skipWithout(t);
  if (!chromium) return;
  const relay = await startRelay({ source: new FakeSource(), gem: 'notes' });
  t.after(() => relay.close());
  const browser = await Chromium.launch(t, chromium);
  const page = await browser.newPage({ width: 1000, height: 700 });
  await page.goto(relay.pageUrl);
  await page.waitFor('the element', `customElements.get('gem-resources-page') !== undefined`);
  const next = new Date(Date.now() + 10 * 60 * 1000);
  next.setSeconds(0, 0);
  // A source with the client's shape in the page (as a preload's bridge gives it).
  await page.evaluate(`(() => {
    window.calls = [];
    window.events = [];
    const gems = [{ gem: 'notes', name: 'Page Demo', resources: ${JSON.stringify(rows(next.toISOString()))} }];
    const el = document.querySelector('gem-resources-page');
    el.source = {
      async status() { return { gems }; },
      async subscribe() {
        return { status: gems, next: () => new Promise(() => {}), close() {}, [Symbol.asyncIterator]() { return this; } };
      },
      async retry(gem, id) { window.calls.push(['retry', gem, id]); return { changed: true }; },
      async downloadNow(gem, id) { window.calls.push(['downloadNow', gem, id]); return { changed: true }; },
      async cancel(gem, id) { window.calls.push(['cancel', gem, id]); throw Object.assign(new Error('the service is busy'), { code: 'E_RESOURCE_BUSY' }); },
    };
    document.addEventListener('gem-resources-action', (e) => window.events.push(e.detail));
    return true;
  })()`);
  const drawn = await page.waitFor('the rows with their buttons', `(() => { const r = ${READ}; return r.length === 4 && r.some((x) => x.buttons.length > 0) && r; })()`);
  const byId = Object.fromEntries(drawn.map((r) => [r.id, r]));
  assert.deepEqual(byId.a.buttons, ['Retry']);
  assert.deepEqual(byId.b.buttons, ['Download now']);
  assert.deepEqual(byId.c.buttons, ['Cancel']);
  assert.deepEqual(byId.d.buttons, []);
  const clock = `${String(next.getHours()).padStart(2, '0')}:${String(next.getMinutes()).padStart(2, '0')}`;
  assert.match(byId.a.cell, new RegExp(`\\(blocklist mode\\)\\. 34\\.0 MiB of 200\\.0 MiB kept; tries again (at|tomorrow at) ${clock}\\. Code:`), byId.a.cell);
  assert.equal(await page.evaluate(`document.querySelector('gem-resources-page').shadowRoot.querySelector('h2').textContent`), 'Files of Page Demo');

  await page.evaluate(click('a', 'retry'));
  await page.evaluate(click('b', 'downloadNow'));
  await page.evaluate(click('c', 'cancel'));
  const calls = await page.waitFor('the three calls', `window.calls.length === 3 && window.calls`);
  assert.deepEqual(calls, [['retry', 'notes', 'a'], ['downloadNow', 'notes', 'b'], ['cancel', 'notes', 'c']]);
  assert.deepEqual(await page.evaluate('window.events'), [
    { gem: 'notes', resource: 'a', action: 'retry' },
    { gem: 'notes', resource: 'b', action: 'downloadNow' },
    { gem: 'notes', resource: 'c', action: 'cancel' },
  ]);
  // A refused action is said on its row.
  const said = await page.waitFor('the refusal', `document.querySelector('gem-resources-page').shadowRoot.querySelector('tr[data-id="c"] .action-error')?.textContent`);
  assert.equal(said, 'Cancel did not go through: the service is busy');

  // The app takes an action over: preventDefault, and the source is not called.
  await page.evaluate(`document.addEventListener('gem-resources-action', (e) => e.preventDefault()); true`);
  await page.evaluate(click('a', 'retry'));
  await page.waitFor('the event', `window.events.length === 4`);
  await new Promise((resolve) => setTimeout(resolve, 200));
  assert.equal(await page.evaluate('window.calls.length'), 3, 'the app handled it: no call of the source');

  // actions="none": no buttons.
  await page.evaluate(`document.querySelector('gem-resources-page').setAttribute('actions', 'none'); true`);
  await page.waitFor('no buttons', `(() => { const r = ${READ}; return r.length === 4 && r.every((x) => x.buttons.length === 0); })()`);
});

test('through the relay the page only watches unless the app enables actions: a POST is refused and no button shows', { timeout: 60_000 }, async (t) => {
  const source = actingSource();
  const relay = await startRelay({ source, gem: 'notes' });
  t.after(() => relay.close());
  const host = `127.0.0.1:${relay.port}`;
  const cookie = await signIn(relay, relay.newPageUrl());
  const r = await request(relay.port, '/act/notes/a/retry', { method: 'POST', headers: { host, cookie, origin: `http://${host}` } });
  assert.equal(r.status, 405, r.body);
  assert.equal(r.headers.allow, 'GET, HEAD');
  assert.deepEqual(source.calls, []);

  const chromium = skipWithout(t);
  if (!chromium) return;
  const browser = await Chromium.launch(t, chromium);
  const page = await browser.newPage({ width: 1000, height: 700 });
  await page.goto(relay.pageUrl);
  const sub = await within(10_000, source.nextSubscription(), 'the relay’s subscription');
  sub.open([{ gem: 'notes', resources: rows(null) }]);
  const drawn = await page.waitFor('the rows', `(() => { const r = ${READ}; return r.length === 4 && r; })()`);
  assert.deepEqual(drawn.map((x) => x.buttons), [[], [], [], []]);
});

test('a relay with actions enabled: the page’s buttons act through it, and its POSTs need the cookie and its own Origin', { timeout: 60_000 }, async (t) => {
  const source = actingSource();
  const relay = await startRelay({ source, gem: 'notes', actions: true });
  t.after(() => relay.close());
  const host = `127.0.0.1:${relay.port}`;
  const cookie = await signIn(relay, relay.newPageUrl());
  const post = (headers, pathname = '/act/notes/a/retry') => request(relay.port, pathname, { method: 'POST', headers: { host, ...headers } });
  assert.equal((await post({ cookie })).status, 403, 'no Origin');
  assert.equal((await post({ cookie, origin: 'http://evil.test' })).status, 403, 'a foreign Origin');
  assert.equal((await post({ cookie, origin: `http://${host}`, 'sec-fetch-site': 'cross-site' })).status, 403, 'cross-site');
  assert.equal((await post({ origin: `http://${host}` })).status, 403, 'no cookie');
  assert.equal((await post({ cookie, origin: 'http://localhost:1' , host: `localhost:${relay.port}` })).status, 403, 'another port');
  assert.equal((await post({ cookie, origin: `http://${host}` }, '/act/other/a/retry')).status, 404, 'a gem it does not feed');
  assert.deepEqual(source.calls, []);
  const ok = await post({ cookie, origin: `http://${host}` });
  assert.equal(ok.status, 200, ok.body);
  assert.deepEqual(JSON.parse(ok.body), { changed: true });
  assert.deepEqual(source.calls, [['retry', 'notes', 'a']]);
  source.calls.length = 0;

  // Only some actions: the others are refused.
  const some = await startRelay({ source, gem: 'notes', actions: ['retry'] });
  t.after(() => some.close());
  const someHost = `127.0.0.1:${some.port}`;
  const someCookie = await signIn(some, some.newPageUrl());
  const refused = await request(some.port, '/act/notes/c/cancel', { method: 'POST', headers: { host: someHost, cookie: someCookie, origin: `http://${someHost}` } });
  assert.equal(refused.status, 405, refused.body);
  assert.deepEqual(source.calls, []);

  const chromium = skipWithout(t);
  if (!chromium) return;
  const browser = await Chromium.launch(t, chromium);
  const page = await browser.newPage({ width: 1000, height: 700 });
  await page.goto(relay.pageUrl);
  const sub = await within(10_000, source.nextSubscription(), 'the relay’s subscription');
  sub.open([{ gem: 'notes', resources: rows(null) }]);
  const drawn = await page.waitFor('the rows with buttons', `(() => { const r = ${READ}; return r.length === 4 && r.some((x) => x.buttons.length > 0) && r; })()`);
  assert.deepEqual(drawn.map((x) => x.buttons), [['Retry'], ['Download now'], ['Cancel'], []]);
  await page.evaluate(click('a', 'retry'));
  await page.evaluate(click('c', 'cancel'));
  await within(5000, (async () => {
    while (source.calls.length < 2) await new Promise((resolve) => setTimeout(resolve, 20));
  })(), 'the calls through the relay');
  assert.deepEqual(source.calls, [['retry', 'notes', 'a'], ['cancel', 'notes', 'c']]);
});
