// `status` during a download in ranged parts says the bytes really held,
// from the API and from another process, never a sparse file's length.

import assert from 'node:assert/strict';
import fs from 'node:fs';
import path from 'node:path';
import { test } from 'node:test';

import { storeLayout } from '../index.js';

import { Fixture, sleep, waitFor } from './fixture.js';

const MiB = 1024 * 1024;
const RATE = 512 * 1024; // per connection

test('status from the API and from the command line reports the bytes the origin has sent, during a download in parts', { timeout: 45_000 }, async (t) => {
  const ctx = await Fixture.start(t);
  const file = ctx.origin.add('big.bin', { size: 48 * MiB });
  ctx.origin.behave('big.bin', { rate: RATE });
  const client = await ctx.connect();
  await ctx.installGem('notes', [ctx.resource(file, { id: 'big', required: false })], client);
  assert.deepEqual(await client.downloadNow('notes', 'big'), { changed: true });

  // Slow connections: the other parts take over ranges of the rest, far into the file.
  await waitFor('the download to open parts', () => ctx.origin.activeResponses('big.bin') >= 3 && ctx.origin.bytesSent('big.bin') >= MiB);
  const parts = ctx.origin.requests.filter((r) => r.path === '/big.bin' && r.range).map((r) => r.range);
  assert.ok(parts.some((r) => Number(/^bytes=(\d+)-/.exec(r)?.[1]) > 24 * MiB), `no part far into the file: ${parts.join(', ')}`);

  const samples = [];
  const sample = async (from, read) => {
    const before = ctx.origin.bytesSent('big.bin');
    const connections = ctx.origin.activeResponses('big.bin');
    const status = await read();
    const after = ctx.origin.bytesSent('big.bin');
    const row = status.gems.find((g) => g.gem === 'notes').resources.find((r) => r.id === 'big');
    // What may be in flight and not yet held: each connection's batch being
    // gathered (256 KiB), one progress step (100 ms) of every connection, and
    // the sockets' buffers.
    const slack = connections * 256 * 1024 + connections * RATE * 0.35 + 512 * 1024;
    samples.push({ from, before, bytes: row.bytes, after, state: row.state });
    assert.equal(row.state, 'downloading', `${from}: ${JSON.stringify(row)}`);
    assert.ok(Number.isInteger(row.bytes), `${from}: no bytes in ${JSON.stringify(row)}`);
    assert.ok(row.bytes <= after, `${from}: status says ${row.bytes} bytes, the origin had sent only ${after} (a sparse file's length?)`);
    assert.ok(row.bytes >= before - slack, `${from}: status says ${row.bytes} bytes, the origin had sent ${before}`);
  };
  for (let i = 0; i < 4; i++) {
    await sample('api', () => client.status('notes'));
    await sample('cli', async () => {
      const run = await ctx.cli(['status', 'notes']);
      assert.equal(run.code, 0, run.stderr);
      return run.json;
    });
    await sleep(250);
  }
  // What a sparse file's length would have said instead.
  const tmp = path.join(storeLayout(ctx.store), 'tmp');
  const partial = fs.readdirSync(tmp).find((n) => n.startsWith(file.sha256) && n.endsWith('.partial'));
  const length = partial ? fs.statSync(path.join(tmp, partial)).size : 0;
  t.diagnostic(`the partial file's length: ${length}`);
  t.diagnostic(`samples (origin before, status bytes, origin after): ${samples.map((s) => `${s.from} ${s.before}/${s.bytes}/${s.after}`).join("; ")}`);
  assert.ok(samples.some((s) => s.bytes > 0), JSON.stringify(samples));
  assert.ok(samples.at(-1).after < file.size / 2, `the download ran too fast to test: ${JSON.stringify(samples)}`);

  assert.deepEqual(await client.cancel('notes', 'big'), { changed: true });
  await waitFor('the cancelled download to close its connections', () => ctx.origin.activeResponses('big.bin') === 0);
});
