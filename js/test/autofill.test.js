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
