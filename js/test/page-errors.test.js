// The gem page in headless Chromium: the heading says the gem's `name`
// where its status has one; the failed rows: a 404 reads "not found
// on the server" and a 500 "the server had an error" (distinct words); a
// SHA-256 mismatch shows short hashes, the full ones on demand.
// GEM_PAGE_ERRORS_SHOT=file.png (360 px) and GEM_PAGE_ERRORS_SHOT_WIDE=file.png
// (1000 px) save screenshots.

import assert from 'node:assert/strict';
import path from 'node:path';
import { test } from 'node:test';

import { startRelay } from '../page/relay.js';

import { Chromium, findChromium, statusRow } from './page-fixture.js';

const A = 'a'.repeat(64);
const B = 'b43f'.repeat(16);

function failed(id, line) {
  return statusRow({ id, state: 'failed', code: 'E_RESOURCE_UNAVAILABLE', primary_cause: line.split(':')[0], message: `resource "${id}": every address failed\n  - ${line}` });
}

const ROWS = [
  failed('gone', 'E_RESOURCE_HTTP: https://cdn.test/gone.bin: HTTP status 404 Not Found'),
  failed('broken', 'E_RESOURCE_HTTP: https://cdn.test/broken.bin: HTTP status 500 Internal Server Error'),
  failed('bad', `E_RESOURCE_SHA256: https://cdn.test/bad.bin: SHA-256 mismatch: expected ${A}, got ${B}`),
];

/** A source whose status holds the failed rows, and whose subscription stays quiet. */
const source = {
  async status() {
    return { gems: [{ gem: 'notes', name: 'Page Demo', resources: ROWS }] };
  },
  async subscribe() {
    const sub = {
      status: [{ gem: 'notes', name: 'Page Demo', resources: ROWS }],
      next: () => new Promise(() => {}),
      close() {},
      [Symbol.asyncIterator]() {
        return this;
      },
    };
    return sub;
  },
};

const READ = `[...document.querySelector('gem-resources-page').shadowRoot.querySelectorAll('tbody tr[data-id]')].map((tr) => {
  const d = tr.querySelector('details.hashes');
  return {
    id: tr.dataset.id,
    headline: tr.querySelector('.headline')?.textContent,
    text: tr.querySelector('td.state .text')?.textContent,
    cell: tr.querySelector('td.state').textContent,
    hashes: d ? { open: d.open, codes: [...d.querySelectorAll('code')].map((c) => c.textContent) } : null,
  };
})`;

test('the heading says the gem’s name; failed rows: 404 and 500 in distinct words; a SHA-256 mismatch in short hashes, the full ones on demand', { timeout: 60_000 }, async (t) => {
  const chromium = findChromium();
  if (!chromium) {
    const message = 'Chromium is missing: the failed rows were NOT tested in a browser (apt-get install chromium, or CHROMIUM=/path)';
    process.stderr.write(`\n*** SKIPPED: ${message}\n\n`);
    t.skip(message);
    return;
  }
  const relay = await startRelay({ source, gem: 'notes' });
  t.after(() => relay.close());
  const browser = await Chromium.launch(t, chromium);
  const page = await browser.newPage({ width: 360, height: 800 });
  await page.goto(relay.pageUrl);
  const rows = await page.waitFor('the failed rows', `(() => { const r = ${READ}; return r.length === 3 && r; })()`);
  const byId = Object.fromEntries(rows.map((r) => [r.id, r]));
  assert.equal(await page.evaluate(`document.querySelector('gem-resources-page').shadowRoot.querySelector('h2').textContent`), 'Files of Page Demo', 'the gem’s name, where its status has one');
  assert.equal(byId.gone.headline, 'Failed: Not found on the server');
  assert.equal(byId.broken.headline, 'Failed: The server had an error');
  assert.notEqual(byId.gone.headline, byId.broken.headline);
  assert.match(byId.bad.text, new RegExp(`expected ${A.slice(0, 12)}…, got ${B.slice(0, 12)}…`));
  assert.doesNotMatch(byId.bad.text, /[0-9a-f]{13}/, 'no long hash in the words');
  assert.deepEqual(byId.bad.hashes, { open: false, codes: [A, B] });
  assert.equal(byId.gone.hashes, null);
  for (const r of rows) assert.doesNotMatch(r.cell, /null|undefined/, r.id);
  assert.equal(byId.gone.cell, '✕Failed: Not found on the server — HTTP status 404 Not Found. Code: E_RESOURCE_UNAVAILABLE, caused by E_RESOURCE_HTTP');
  if (process.env.GEM_PAGE_ERRORS_SHOT_WIDE) {
    await page.resize(1000, 600);
    await page.screenshot(path.resolve(process.env.GEM_PAGE_ERRORS_SHOT_WIDE), { height: await page.evaluate(`Math.ceil(document.querySelector('gem-resources-page').getBoundingClientRect().bottom + 16)`) });
    await page.resize(360, 800);
  }
  if (process.env.GEM_PAGE_ERRORS_SHOT) {
    await page.screenshot(path.resolve(process.env.GEM_PAGE_ERRORS_SHOT), { height: await page.evaluate(`Math.ceil(document.querySelector('gem-resources-page').getBoundingClientRect().bottom + 16)`) });
  }
});
