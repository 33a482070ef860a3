// The gem page: the relay (js/page/relay.js) refuses what is not its own
// page, and <gem-resources-page> (js/page/gem-resources-page.js) draws a
// real service's downloads in headless Chromium.
//
// GEM_PAGE_SCREENSHOT=../docs/gem-page.png saves a screenshot at 800 px of
// width, GEM_PAGE_SCREENSHOT_NARROW=/tmp/narrow.png one at 320 px (paths
// from the current folder); unset, nothing is written. CHROMIUM=/path
// names the browser (else /usr/bin/chromium and the like).

import assert from 'node:assert/strict';
import path from 'node:path';
import { test } from 'node:test';

import { startRelay } from '../page/relay.js';

import { Fixture, waitFor, within } from './fixture.js';
import { Chromium, FakeSource, eventStream, findChromium, request, signIn, statusRow } from './page-fixture.js';

const MiB = 1024 * 1024;

async function fakeRelay(t, source = new FakeSource({ status: fakeStatus() })) {
  const relay = await startRelay({ source, gem: 'notes' });
  t.after(() => relay.close());
  const host = `127.0.0.1:${relay.port}`;
  const cookie = await signIn(relay, relay.pageUrl);
  return { relay, source, host, port: relay.port, base: '/', cookie };
}

function fakeStatus() {
  return {
    gems: [
      { gem: 'notes', installed_by: { kind: 'api' }, resources: [statusRow({ id: 'model', required: true })] },
      { gem: 'letters', installed_by: { kind: 'api' }, resources: [statusRow({ id: 'other' })] },
    ],
    undeclared_files: 0,
    undeclared_bytes: 0,
    service: { socket: '/home/me/secret/run/api.sock', pid: 42 },
    store: '/home/me/secret',
  };
}

test('the relay serves its page and the feed of its gem to its own origin with the token', { timeout: 20_000 }, async (t) => {
  const { host, port, base, relay, cookie } = await fakeRelay(t);
  assert.match(relay.token, /^[0-9a-f]{48}$/);
  assert.equal(relay.pageUrl, `http://127.0.0.1:${port}/page/index.html?gem=notes&token=${relay.token}`);

  const page = await request(port, `${base}page/index.html?gem=notes`, { headers: { host, cookie } });
  assert.equal(page.status, 200);
  assert.match(page.headers['content-type'], /^text\/html/);
  assert.match(page.body, /<gem-resources-page/);
  assert.equal(page.headers['referrer-policy'], 'no-referrer');
  assert.match(page.headers['content-security-policy'], /script-src 'self' 'sha256-[A-Za-z0-9+/=]+'/);
  assert.match(page.headers['content-security-policy'], /connect-src 'self'/);
  for (const file of ['page/gem-resources-page.js', 'model.js']) {
    const r = await request(port, `${base}${file}`, { headers: { host: `localhost:${port}`, origin: `http://localhost:${port}`, 'sec-fetch-site': 'same-origin', cookie } });
    assert.equal(r.status, 200, file);
    assert.match(r.headers['content-type'], /^text\/javascript/, file);
  }
  assert.equal((await request(port, base, { headers: { host, cookie } })).status, 302);

  // The status of its gem only, without the service's socket or the store's path.
  const status = await request(port, `${base}feed/notes/status`, { headers: { host, cookie } });
  assert.equal(status.status, 200);
  const body = JSON.parse(status.body);
  assert.deepEqual(Object.keys(body), ['gems']);
  assert.deepEqual(body.gems.map((g) => g.gem), ['notes']);
});

test('the relay refuses no cookie, a wrong token, a wrong Host and a foreign Origin (403), any other path (404), and every method but GET', { timeout: 20_000 }, async (t) => {
  const { host: h, port, base, relay, cookie } = await fakeRelay(t);
  const host = h;
  const good = `${base}page/index.html`;
  const fresh = new URL(relay.newPageUrl()).searchParams.get('token');
  const wrongToken = fresh.replace(/^./, (c) => (c === 'a' ? 'b' : 'a'));
  const refused = [
    ['no cookie', '/page/index.html', { host }],
    ['the root without a cookie', '/', { host }],
    ['the feed without a cookie', '/feed/notes/status', { host }],
    ['another relay’s cookie name', '/page/index.html', { host, cookie: cookie.replace(/^gem_relay_\d+/, `gem_relay_${port + 1}`) }],
    ['a wrong cookie', '/page/index.html', { host, cookie: cookie.replace(/=./, (c) => (c === '=a' ? '=b' : '=a')) }],
    ['a wrong token', `/page/index.html?token=${wrongToken}`, { host }],
    ['a token cut short', `/page/index.html?token=${fresh.slice(0, -1)}`, { host }],
    ['the token in the path', `/${fresh}/page/index.html`, { host }],
    ['a foreign Host', `/page/index.html?token=${fresh}`, { host: `evil.test:${port}` }],
    ['a foreign Host with the cookie', good, { host: `evil.test:${port}`, cookie }],
    ['a rebinding name', good, { cookie, host: `127.0.0.1.nip.io:${port}` }],
    ['another port', good, { cookie, host: `127.0.0.1:${port + 1}` }],
    ['no port', good, { cookie, host: '127.0.0.1' }],
    ['no Host', good, { cookie }],
    ['a foreign Origin', good, { cookie, host, origin: 'http://evil.test' }],
    ['an Origin of the other loopback name', good, { cookie, host, origin: `http://localhost:${port}` }],
    ['an https Origin', good, { cookie, host, origin: `https://127.0.0.1:${port}` }],
    ['the null Origin', good, { cookie, host, origin: 'null' }],
    ['a cross-site fetch', good, { cookie, host, 'sec-fetch-site': 'cross-site' }],
    ['a same-site fetch', `${base}feed/notes/status`, { cookie, host, 'sec-fetch-site': 'same-site' }],
    ['the feed from a foreign Origin', `${base}feed/notes/events`, { cookie, host, origin: 'http://evil.test' }],
  ];
  for (const [what, pathname, headers] of refused) {
    const r = await request(port, pathname, { headers });
    assert.equal(r.status, 403, `${what}: ${r.status} ${r.body}`);
    assert.doesNotMatch(r.body, /gem-resources-page|"gems"/, what);
  }
  const missing = ['page/relay.js', 'page/README.md', 'index.js', 'model.d.ts', 'package.json', 'test/fixture.js', 'feed/letters/status', 'feed/letters/events', 'feed/notes/path', 'feed/notes/install', 'feed/notes/policy', 'feed/notes', 'page/%2e%2e/index.js', 'page/..%2findex.js', 'page/index.html/'];
  for (const rest of missing) {
    const r = await request(port, `${base}${rest}`, { headers: { host, cookie } });
    assert.equal(r.status, 404, `${rest}: ${r.status} ${r.body}`);
  }
  for (const method of ['POST', 'PUT', 'DELETE', 'OPTIONS', 'PATCH']) {
    const r = await request(port, `${base}feed/notes/status`, { method, headers: { host, cookie } });
    assert.equal(r.status, 405, `${method}: ${r.status}`);
  }
});

test('the relay’s event stream: the status, the events, the status again after lagged, then lost', { timeout: 20_000 }, async (t) => {
  const { host, port, base, source, cookie } = await fakeRelay(t);
  const opening = eventStream(port, `${base}feed/notes/events`, { host, 'sec-fetch-site': 'same-origin', cookie });
  const first = await within(5000, source.nextSubscription(), 'the relay’s subscription');
  assert.deepEqual(first.options, { gem: 'notes' });
  first.open([{ gem: 'notes', resources: [statusRow({ id: 'model' })] }]);
  const stream = await opening;
  t.after(() => stream.close());
  assert.match(stream.headers['content-type'], /^text\/event-stream/);
  assert.deepEqual(await stream.next(), { event: 'relay', data: { app: null, gem: 'notes', actions: [] } });
  const status = await stream.next();
  assert.equal(status.event, 'status');
  assert.equal(status.data[0].resources[0].id, 'model');

  const progress = { event: 'progress', at: '2026-12-01T18:40:02.513Z', gem: 'notes', resource: 'model', sha256: '0'.repeat(64), bytes: 5, size: 10, address: 'https://cdn.test/m', bytes_per_sec: 5, eta_secs: 1 };
  first.push(progress);
  assert.deepEqual(await stream.next(), { event: 'message', data: progress });

  first.fail(Object.assign(new Error('lagged'), { code: 'E_RESOURCE_LAGGED', missed: 4 }));
  const second = await within(5000, source.nextSubscription(), 'a subscription after lagged');
  second.open([{ gem: 'notes', resources: [statusRow({ id: 'model', state: 'present' })] }]);
  const again = await stream.next();
  assert.equal(again.event, 'status');
  assert.equal(again.data[0].resources[0].state, 'present');

  second.fail(Object.assign(new Error('the connection closed'), { code: 'E_RESOURCE_SERVICE' }));
  const lost = await stream.next();
  assert.deepEqual(lost, { event: 'lost', data: { code: 'E_RESOURCE_SERVICE', message: 'the connection closed', app: null } });
  await waitFor('the stream to end', () => stream.ended);
});

/** The page's rows as text, from the element's shadow root. */
const READ_PAGE = `(() => {
  const el = document.querySelector('gem-resources-page');
  const root = el && el.shadowRoot;
  if (!root) return null;
  const text = (n) => (n ? n.textContent.replace(/\\s+/g, ' ').trim() : null);
  return {
    heading: text(root.querySelector('h2')),
    summary: text(root.querySelector('.summary')),
    notice: text(root.querySelector('.notice')),
    columns: [...root.querySelectorAll('thead th')].map((th) => [text(th), th.getAttribute('scope')]),
    rows: [...root.querySelectorAll('tbody tr[data-id]')].map((tr) => {
      const p = tr.querySelector('progress');
      const th = tr.querySelector('th');
      const cell = (c) => text(tr.querySelector('td.' + c));
      // What a screen reader reads of the state: without the aria-hidden marks, and the buttons apart.
      const spoken = (n) => { const copy = n.cloneNode(true); copy.querySelectorAll('[aria-hidden="true"], button').forEach((h) => h.remove()); return text(copy); };
      return {
        id: tr.dataset.id,
        state: tr.dataset.state,
        file: text(th),
        scope: th.getAttribute('scope'),
        size: cell('size'),
        host: cell('host'),
        when: cell('when'),
        status: spoken(tr.querySelector('td.state')),
        mark: text(tr.querySelector('td.state .mark')),
        buttons: [...tr.querySelectorAll('button')].map(text),
        progress: p ? { value: p.hasAttribute('value') ? p.value : null, max: p.max, label: p.getAttribute('aria-label') } : null,
      };
    }),
  };
})()`;

/** Where the element ends, and a margin: the height of a screenshot. */
const BOTTOM = `Math.ceil(document.querySelector('gem-resources-page').getBoundingClientRect().bottom + 16)`;

test('<gem-resources-page> in headless Chromium through the relay: rows, live progress, a policy block in words, verified', { timeout: 120_000 }, async (t) => {
  const chromium = findChromium();
  if (!chromium) {
    const message = `Chromium is missing${process.env.CHROMIUM ? ` at CHROMIUM=${process.env.CHROMIUM}` : ''}: the gem page was NOT tested in a browser. Install it (apt-get install chromium) or set CHROMIUM=/path/to/chromium`;
    process.stderr.write(`\n*** SKIPPED: ${message}\n\n`);
    t.diagnostic(message);
    t.skip(message);
    return;
  }
  // One stream per file: the origin's rate is the download's.
  const ctx = await Fixture.start(t, { network: { connections_per_file: 1 } });
  const model = ctx.origin.add('model.onnx', { size: 8 * MiB });
  ctx.origin.behave('model.onnx', { rate: 256 * 1024 });
  const dict = ctx.origin.add('en.dict', { size: 200 * 1024 });
  const voices = ctx.origin.add('voices.tar', { size: 1 * MiB });
  const fonts = ctx.origin.add('fonts.zip', { size: 2 * MiB });
  ctx.origin.behave('fonts.zip', { rate: 64 * 1024 });
  const client = await ctx.connect();
  await ctx.installGem('notes', [
    ctx.resource(model, { id: 'ocr', required: true, description: 'Handwriting recognition model' }),
    ctx.resource(dict, { id: 'dict', required: true, host: 'mirror.test', description: 'English dictionary' }),
    ctx.resource(voices, { id: 'voices', required: false, host: 'mirror.test', description: 'Reading voices' }),
    ctx.resource(fonts, { id: 'fonts', required: true, host: 'blocked.test', description: 'Extra fonts' }),
  ], client);

  // With the page's actions, as an app that lets its user act.
  const relay = await startRelay({ source: client, gem: 'notes', actions: true });
  t.after(() => relay.close());
  const browser = await Chromium.launch(t, chromium);
  const page = await browser.newPage({ width: 800, height: 600 });
  await page.goto(relay.pageUrl);

  const view = await page.waitFor('the four rows', `(() => { const v = ${READ_PAGE}; return v && v.rows.length === 4 && v; })()`);
  assert.equal(view.heading, 'Files of notes');
  assert.deepEqual(view.columns, [['File', 'col'], ['Size', 'col'], ['Host', 'col'], ['Downloads', 'col'], ['State', 'col']]);
  const byId = Object.fromEntries(view.rows.map((r) => [r.id, r]));
  assert.deepEqual(view.rows.map((r) => r.id), ['ocr', 'dict', 'voices', 'fonts']);
  assert.deepEqual(
    [byId.ocr.file, byId.ocr.scope, byId.ocr.size, byId.ocr.host, byId.ocr.when],
    ['Handwriting recognition model model.onnx', 'row', '8.0 MiB', 'cdn.test', 'Right after install'],
  );
  assert.deepEqual([byId.dict.size, byId.dict.host, byId.dict.when], ['200.0 KiB', 'mirror.test', 'Right after install']);
  assert.deepEqual([byId.voices.file, byId.voices.size, byId.voices.host, byId.voices.when], ['Reading voices voices.tar', '1.0 MiB', 'mirror.test', 'Only when used']);
  assert.equal(byId.fonts.host, 'blocked.test', 'the host, without the origin’s port');
  for (const row of view.rows) assert.doesNotMatch(row.host, /:\d/, `${row.id}: a port in the host`);

  // A live <progress> whose value grows.
  const first = await page.waitFor('a progress bar with bytes', `(() => { const r = ${READ_PAGE}.rows.find((r) => r.id === 'ocr'); return r.progress && r.progress.value > 0 && r; })()`);
  assert.equal(first.state, 'downloading');
  assert.equal(first.progress.max, 8 * MiB);
  assert.equal(first.progress.label, 'Handwriting recognition model: download progress');
  assert.match(first.status, /^Downloading: [\d.]+ (KiB|MiB) of 8\.0 MiB \(\d+%\)/);
  const grown = await page.waitFor(
    'the progress bar to grow',
    `(() => { const r = ${READ_PAGE}.rows.find((r) => r.id === 'ocr'); return r.progress && r.progress.value > ${first.progress.value} && r; })()`,
  );
  assert.ok(grown.progress.value <= 8 * MiB);
  await page.waitFor('the service’s rate and time left', `${READ_PAGE}.rows.find((r) => r.id === 'ocr').status.match(/KiB\\/s, about \\d+ (s|min) left/)`);

  // The eager dictionary arrives; the lazy voices wait to be used.
  const dictDone = await page.waitFor('the dictionary verified', `(() => { const r = ${READ_PAGE}.rows.find((r) => r.id === 'dict'); return r.state === 'present' && r; })()`);
  assert.equal(dictDone.status, 'Downloaded and verified');
  assert.equal(dictDone.mark, '✓');
  assert.equal(dictDone.progress, null);
  const lazy = (await page.evaluate(READ_PAGE)).rows.find((r) => r.id === 'voices');
  assert.equal(lazy.state, 'missing');
  assert.equal(lazy.status, 'Not downloaded: downloads when first used');
  assert.deepEqual(lazy.buttons, ['Download now'], 'a lazy file can be fetched now');
  assert.deepEqual(dictDone.buttons, [], 'a verified file has nothing to do');
  assert.equal(ctx.origin.requestCount('voices.tar'), 0);

  // The app blocks the fonts' host mid-download: the row says so in words.
  await waitFor('the fonts to download', () => ctx.origin.bytesSent('fonts.zip') > 0);
  const changed = await client.setPolicy({ mode: 'blocklist', hosts: ['blocked.test'] });
  assert.equal(changed.stopped, 1);
  const blocked = await page.waitFor('the policy block in words', `(() => { const v = ${READ_PAGE}; const r = v.rows.find((r) => r.id === 'fonts'); return r.state === 'failed' && v.notice && { r, v }; })()`);
  // With what it kept (when bytes had come) and when the service tries it
  // again by itself (a required file, retry_failed_after later).
  assert.match(
    blocked.r.status,
    /^Failed: Blocked by the network policy — host blocked\.test is not permitted by the network policy \(blocklist mode\)\. (?:[\d.]+ (?:B|KiB|MiB) of 2\.0 MiB kept; tries|Tries) again (?:at|tomorrow at) \d\d:\d\d\. Code: E_RESOURCE_UNAVAILABLE, caused by E_RESOURCE_POLICY$/,
  );
  assert.equal(blocked.r.progress, null);
  assert.deepEqual(blocked.r.buttons, ['Retry'], 'a failed file can be tried again');
  assert.match(blocked.v.notice, /^The network policy changed at \d{2}:\d{2}:\d{2}: blocklist, 1 blocked host pattern\.$/);
  assert.match(blocked.v.summary, /^1 of 4 files ready, 1 downloading, 1 blocked by the network policy \(11\.2 MiB in all\)\.$/);

  // What a screenshot shows: every row's state in text, no horizontal overflow.
  const shot = process.env.GEM_PAGE_SCREENSHOT;
  if (shot) {
    // For the picture only: a bar a good way along.
    await page.waitFor('a quarter of the model', `${READ_PAGE}.rows.find((r) => r.id === 'ocr').progress?.value >= ${2 * MiB}`, { timeout: 30_000 });
    const file = path.resolve(shot);
    await page.screenshot(file, { height: await page.evaluate(BOTTOM) });
    t.diagnostic(`screenshot at 800 px: ${file}`);
  }

  // 320 px wide: the cells stack, nothing sticks out.
  await page.resize(320, 800);
  const narrow = await page.waitFor('the stacked layout', `(() => {
    const root = document.querySelector('gem-resources-page').shadowRoot;
    const td = root.querySelector('tbody td.state');
    const thead = root.querySelector('thead');
    return getComputedStyle(td).display === 'block' && {
      scrollWidth: document.documentElement.scrollWidth,
      theadWidth: thead.getBoundingClientRect().width,
      label: getComputedStyle(root.querySelector('tbody td.size'), '::before').content,
      widest: Math.max(...[...root.querySelectorAll('tbody td, tbody th')].map((c) => c.getBoundingClientRect().right)),
    };
  })()`);
  assert.ok(narrow.scrollWidth <= 320, `the page is ${narrow.scrollWidth} px wide at 320`);
  assert.ok(narrow.widest <= 320, `a cell reaches ${narrow.widest} px`);
  assert.ok(narrow.theadWidth <= 1, 'the column headers are visually hidden (each cell says its own)');
  assert.equal(narrow.label, '"Size: "');
  const narrowShot = process.env.GEM_PAGE_SCREENSHOT_NARROW;
  if (narrowShot) {
    const file = path.resolve(narrowShot);
    await page.screenshot(file, { height: await page.evaluate(BOTTOM) });
    t.diagnostic(`screenshot at 320 px: ${file}`);
  }
  await page.resize(800, 600);

  // The model at full speed: verified, and the bar goes.
  ctx.origin.behave('model.onnx', { rate: undefined });
  const done = await page.waitFor('the model verified', `(() => { const r = ${READ_PAGE}.rows.find((r) => r.id === 'ocr'); return r.state === 'present' && r; })()`, { timeout: 30_000 });
  assert.equal(done.status, 'Downloaded and verified');
  assert.equal(done.progress, null);
  const end = await page.evaluate(READ_PAGE);
  assert.match(end.summary, /^2 of 4 files ready, 1 blocked by the network policy/);
  assert.deepEqual(page.logs.filter((l) => /exception|error/i.test(l)), [], 'the page logged errors');

  // The same page without a relay: the demo's `source` property.
  await page.goto(relay.pageUrl.replace(/\?gem=.*$/, ''));
  const demo = await page.waitFor('the demo rows', `(() => { const v = ${READ_PAGE}; return v && v.rows.length === 4 && v; })()`);
  assert.equal(demo.heading, 'Files of demo');
  assert.equal(demo.rows[0].file, 'Handwriting recognition model ocr.onnx');
});
