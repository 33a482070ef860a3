// A Rust host feeding the gem page over its own bridge (Tauri and other
// web views): `bridgeSource` reading examples/page_host.rs's messages, and
// its handling of `lagged` and `error`.

import assert from 'node:assert/strict';
import { spawn } from 'node:child_process';
import fs from 'node:fs';
import path from 'node:path';
import readline from 'node:readline';
import { test } from 'node:test';

import { bridgeSource, watchGem } from '../model.js';

import { binary, waitFor } from './fixture.js';
import { statusRow } from './page-fixture.js';

const SHA = 'a'.repeat(64);

test("the page's model follows examples/page_host.rs over a bridge: status, events, then the end", { timeout: 60_000 }, async (t) => {
  const host = path.join(path.dirname(binary), 'examples', process.platform === 'win32' ? 'page_host.exe' : 'page_host');
  if (!fs.existsSync(host)) {
    t.skip(`${host} is not built (cargo build --example page_host)`);
    return;
  }
  let child = null;
  const source = bridgeSource((gem, onMessage) => {
    assert.equal(gem, 'notes');
    child = spawn(host, [], { stdio: ['ignore', 'pipe', 'inherit'] });
    readline.createInterface({ input: child.stdout }).on('line', (line) => onMessage(JSON.parse(line)));
    return () => child.kill();
  });
  t.after(() => child?.kill());
  const seen = [];
  const watch = watchGem(source, 'notes', (rows, model) => seen.push({ states: rows.map((r) => r.state), connection: model.connection.state }), { retryDelaysMs: [60_000] });
  t.after(() => watch.stop());
  await watch.ready;
  assert.equal(watch.model.installed, false, 'the page opened before the install has no rows');
  await waitFor('the file verified on the page', () => watch.model.rows[0]?.state === 'present', { timeout: 30_000 });
  assert.equal(watch.model.rows[0].id, 'ocr');
  assert.ok(seen.some((s) => s.states[0] === 'downloading'), JSON.stringify(seen));
  // The host quits: the feed ends with its error, and the page says it lost contact.
  await waitFor('the feed lost', () => watch.model.connection.state === 'lost', { timeout: 30_000 });
  assert.equal(watch.model.connection.error.code, 'E_RESOURCE_SHUTDOWN');
});

test('bridgeSource: lagged subscribes again and redraws from the new status; an error ends the feed', async () => {
  const feeds = [];
  const source = bridgeSource((gem, onMessage) => {
    const feed = { gem, onMessage, stopped: false };
    feeds.push(feed);
    queueMicrotask(() => onMessage({ status: [{ gem, installed_by: { kind: 'api' }, resources: [statusRow({ id: 'm', sha256: SHA })] }] }));
    return () => {
      feed.stopped = true;
    };
  });
  const watch = watchGem(source, 'notes', null, { retryDelaysMs: [60_000] });
  await watch.ready;
  assert.equal(watch.model.rows[0].state, 'missing');
  feeds[0].onMessage({ event: { event: 'queued', at: '2026-12-01T18:40:02.513Z', gem: 'notes', resource: 'm', sha256: SHA, size: 3 } });
  await waitFor('queued', () => watch.model.rows[0].state === 'queued');
  feeds[0].onMessage({ lagged: 7 });
  await waitFor('a second feed', () => feeds.length === 2);
  assert.equal(feeds[0].stopped, true, 'the lagged feed is stopped');
  await waitFor('redrawn from the new status', () => watch.model.rows[0].state === 'missing');
  assert.deepEqual(watch.model.connection.lagged, { missed: 7 });
  feeds[1].onMessage({ error: { code: 'E_RESOURCE_SHUTDOWN', message: 'the service shut down' } });
  await waitFor('lost', () => watch.model.connection.state === 'lost');
  assert.equal(watch.model.connection.error.code, 'E_RESOURCE_SHUTDOWN');
  assert.equal(feeds[1].stopped, true);
  watch.stop();
});
