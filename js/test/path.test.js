// One download however many clients ask for the same file.

import assert from 'node:assert/strict';
import fs from 'node:fs';
import { test } from 'node:test';

import { Fixture, sha256 } from './fixture.js';

test('five clients asking at once for one missing lazy file share one download and get the same verified path', { timeout: 30_000 }, async (t) => {
  const ctx = await Fixture.start(t);
  // Under the ranged-parts threshold: one download is one request.
  const file = ctx.origin.add('lazy.bin', { size: 256 * 1024 });
  // Slow enough that every request arrives while the download runs.
  ctx.origin.behave('lazy.bin', { rate: 512 * 1024 });
  await ctx.installGem('notes', [ctx.resource(file, { id: 'lazy', required: false })]);
  assert.equal(ctx.origin.requestCount('lazy.bin'), 0, 'a lazy file was fetched at install');

  const clients = await Promise.all([1, 2, 3, 4, 5].map(() => ctx.connect()));
  const answers = await Promise.all(clients.map((c) => c.path('notes', 'lazy')));
  for (const answer of answers) {
    assert.equal(answer.gem, 'notes');
    assert.equal(answer.resource, 'lazy');
  }
  const paths = new Set(answers.map((a) => a.path));
  assert.equal(paths.size, 1, `different paths: ${[...paths].join(', ')}`);
  const [where] = paths;
  assert.equal(sha256(fs.readFileSync(where)), file.sha256);
  assert.equal(ctx.origin.requestCount('lazy.bin'), 1, `the origin saw ${ctx.origin.requestCount('lazy.bin')} GETs`);

  // Asked again, by a tool's ctx.resources and by the command line: no new request.
  assert.equal(await clients[0].forGem('notes').path('lazy'), where);
  const cli = await ctx.cli(['path', 'notes', 'lazy']);
  assert.equal(cli.code, 0, cli.stderr);
  assert.equal(cli.json.path, where);
  assert.equal(ctx.origin.requestCount('lazy.bin'), 1);
});
