// The gem page's time left in headless Chromium: `--` for the first
// seconds after a download starts or resumes (its first estimates are
// guesses), then the service's estimate.

import assert from 'node:assert/strict';
import { test } from 'node:test';

// The element's ETA_AFTER_MS (the element's module needs a browser).
const ETA_AFTER_MS = 5000;
import { startRelay } from '../page/relay.js';

import { within } from './fixture.js';
import { Chromium, FakeSource, findChromium, statusRow } from './page-fixture.js';

const MiB = 1024 * 1024;
const SHA = '0'.repeat(64);

const STATE = `document.querySelector('gem-resources-page').shadowRoot.querySelector('tr[data-id="model"] td.state .text')?.textContent`;

test('the time left reads -- for a few seconds after a start and after a resume, then the service’s estimate', { timeout: 60_000 }, async (t) => {
  const chromium = findChromium();
  if (!chromium) {
    const message = 'Chromium is missing: the time left was NOT tested in a browser (apt-get install chromium, or CHROMIUM=/path)';
    process.stderr.write(`\n*** SKIPPED: ${message}\n\n`);
    t.skip(message);
    return;
  }
  const source = new FakeSource();
  const relay = await startRelay({ source, gem: 'notes' });
  t.after(() => relay.close());
  const browser = await Chromium.launch(t, chromium);
  const page = await browser.newPage({ width: 1000, height: 600 });
  await page.goto(relay.pageUrl);
  const sub = await within(10_000, source.nextSubscription(), 'the relay’s subscription');
  sub.open([{ gem: 'notes', resources: [statusRow({ id: 'model', size: 8 * MiB })] }]);
  await page.waitFor('the row', `${STATE}`);

  const base = { gem: 'notes', resource: 'model', sha256: SHA, address: 'https://cdn.test:8443/model.bin' };
  const at = () => new Date().toISOString();
  const progress = (bytes, eta) => sub.push({ event: 'progress', at: at(), ...base, bytes, size: 8 * MiB, bytes_per_sec: 256 * 1024, eta_secs: eta });
  const started = Date.now();
  sub.push({ event: 'started', at: at(), ...base, size: 8 * MiB });
  progress(64 * 1024, 1279);
  const early = await page.waitFor('the first progress', `(() => { const s = ${STATE}; return /KiB\\/s/.test(s) && s; })()`);
  assert.equal(early, '↓Downloading: 64.0 KiB of 8.0 MiB (0%), 256.0 KiB/s, time left: --');
  // After a few seconds, the service's estimate (without a new event).
  const later = await page.waitFor('the estimate', `(() => { const s = ${STATE}; return /about/.test(s) && s; })()`, { timeout: ETA_AFTER_MS + 5000 });
  assert.ok(Date.now() - started >= ETA_AFTER_MS - 200, `the estimate came ${Date.now() - started} ms after the start`);
  assert.match(later, /256\.0 KiB\/s, about 21 min left$/);

  // Stopped, then resumed: `--` again.
  sub.push({ event: 'cancelled', at: at(), ...base, reason: 'paused', partial_bytes: 64 * 1024 });
  await page.waitFor('stopped', `!/Downloading/.test(${STATE})`);
  sub.push({ event: 'resumed', at: at(), ...base, offset: 64 * 1024, size: 8 * MiB });
  progress(128 * 1024, 503);
  const resumed = await page.waitFor('the progress after the resume', `(() => { const s = ${STATE}; return /128\\.0 KiB/.test(s) && s; })()`);
  assert.match(resumed, /time left: --$/);
});
