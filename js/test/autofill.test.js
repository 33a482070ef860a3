// Auto-fill through the API: the network policy, and the mirrors.

import assert from 'node:assert/strict';
import { test } from 'node:test';

import { Fixture } from './fixture.js';

test('autofill refuses a blocked host, and autofillManifest follows the mirrors', { timeout: 30_000 }, async (t) => {
  const ctx = await Fixture.start(t, { network: { mode: 'blocklist', hosts: ['blocked.test'] } });
  const file = ctx.origin.add('dict.bin', { size: 300 * 1024 });
  const client = await ctx.connect();

  const refused = await client.autofill(file.url('blocked.test')).then(
    (r) => assert.fail(`a blocked host was read: ${JSON.stringify(r)}`),
    (e) => e,
  );
  assert.ok(
    refused.code === 'E_RESOURCE_POLICY' || refused.primaryCause === 'E_RESOURCE_POLICY',
    `${refused.code}/${refused.primaryCause}: ${refused.message}`,
  );
  assert.equal(refused.primaryCause, 'E_RESOURCE_POLICY');
  assert.equal(refused.rpcCode, -32000);
  assert.equal(ctx.origin.hostRequests('blocked.test'), 0, 'the blocked host got a request');

  // Permitted: the same file from cdn.test.
  assert.deepEqual(await client.autofill(file.url()), { size: file.size, sha256: file.sha256, served_by: file.url(), final_url: file.url() });

  // The url answers 404; the mirror has it.
  ctx.origin.behave('dict.bin', { status: 404, hosts: ['cdn.test'] });
  const manifest = ctx.manifest('notes', [
    { id: 'dict', url: file.url(), mirrors: [file.url('mirror.test')], required: false },
  ]);
  const filled = await client.autofillManifest(manifest, { urlOnly: true });
  assert.equal(filled.ok, true, JSON.stringify(filled));
  assert.equal(filled.resources.length, 1, JSON.stringify(filled));
  // Only the first address that answers was read (urlOnly): its verdict is ok.
  assert.deepEqual(filled.resources[0], { id: 'dict', size: file.size, sha256: file.sha256, served_by: file.url('mirror.test'), ok: true });
  const entry = filled.manifest.resources[0];
  assert.equal(entry.size, file.size);
  assert.equal(entry.sha256, file.sha256);
  assert.equal(entry.url, file.url());
  assert.deepEqual(entry.mirrors, [file.url('mirror.test')]);
  assert.equal(ctx.origin.requestCount('dict.bin', { host: 'cdn.test' }), 2, 'the url was not tried first');
  assert.equal(ctx.origin.requestCount('dict.bin', { host: 'mirror.test' }), 1);

  // By default every address is read: the url's 404 is reported, and ok is false.
  const checked = await client.autofillManifest(manifest);
  assert.equal(checked.ok, false, JSON.stringify(checked));
  assert.equal(checked.resources[0].sha256, file.sha256);
  const [url, mirror] = checked.resources[0].addresses;
  assert.deepEqual([url.role, url.ok, url.code], ['url', false, 'E_RESOURCE_HTTP'], JSON.stringify(url));
  assert.deepEqual([mirror.role, mirror.ok, mirror.sha256], ['mirror 1', true, file.sha256], JSON.stringify(mirror));

  // A manifest whose only address is blocked: that resource names the policy.
  const blocked = await client.autofillManifest(
    ctx.manifest('notes', [{ id: 'b', url: file.url('blocked.test'), required: false }]),
  );
  assert.equal(blocked.resources[0].id, 'b');
  assert.equal(blocked.resources[0].primary_cause, 'E_RESOURCE_POLICY', JSON.stringify(blocked.resources[0]));
  assert.equal(ctx.origin.hostRequests('blocked.test'), 0, 'the blocked host got a request');
});

test('autofill and autofillManifest report how far each resource has been read', { timeout: 30_000 }, async (t) => {
  const ctx = await Fixture.start(t);
  const big = ctx.origin.add('big.bin', { size: 1024 * 1024 });
  const small = ctx.origin.add('small.bin', { size: 1000 });
  // About 1.3 s for the big file: several reports, each at most every 100 ms.
  ctx.origin.behave('big.bin', { rate: 800 * 1024 });
  const client = await ctx.connect();

  const seen = [];
  const one = await client.autofill(big.url(), { onProgress: (p) => seen.push(p) });
  assert.equal(one.sha256, big.sha256);
  assert.ok(seen.length >= 3, JSON.stringify(seen));
  for (const p of seen) {
    assert.equal(p.event, 'autofill_progress');
    assert.equal(p.resource, 'big.bin');
    assert.equal(p.address, big.url());
  }
  const bytes = seen.map((p) => p.bytes);
  assert.deepEqual([...bytes].sort((a, b) => a - b), bytes, 'bytes never go back');
  assert.ok(seen.some((p) => !p.done && p.bytes > 0 && p.bytes < big.size), JSON.stringify(seen));
  assert.ok(seen.some((p) => !p.done && p.size === big.size), 'the announced size is told before the end');
  assert.deepEqual(seen.at(-1), { event: 'autofill_progress', resource: 'big.bin', address: big.url(), bytes: big.size, size: big.size, done: true });
  assert.equal(seen.filter((p) => p.done).length, 1);

  // A manifest: each resource reports, and each ends with done (a failed one too).
  ctx.origin.behave('small.bin', { status: 404 });
  const manifest = ctx.manifest('notes', [
    { id: 'big', url: big.url(), required: false },
    { id: 'gone', url: small.url(), required: false },
  ]);
  const reports = [];
  const filled = await client.autofillManifest(manifest, { onProgress: (p) => reports.push(p) });
  assert.equal(filled.resources[0].sha256, big.sha256);
  const done = reports.filter((p) => p.done);
  assert.deepEqual(done.map((p) => p.resource).sort(), ['big', 'gone'], JSON.stringify(reports));
  assert.deepEqual(done.find((p) => p.resource === 'gone'), { event: 'autofill_progress', resource: 'gone', address: small.url(), bytes: 0, size: null, done: true });
  assert.ok(reports.some((p) => p.resource === 'big' && !p.done && p.bytes > 0 && p.bytes < big.size), JSON.stringify(reports));

  // Without onProgress nothing is sent for the call.
  assert.equal((await client.autofill(small.url()).catch((e) => e)).primaryCause, 'E_RESOURCE_HTTP');
});
