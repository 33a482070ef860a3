// Only the service's own user may talk to it.

import assert from 'node:assert/strict';
import { execFileSync, spawn } from 'node:child_process';
import fs from 'node:fs';
import path from 'node:path';
import { test } from 'node:test';

import { Fixture } from './fixture.js';

const USER = 'gr-js-test';

/** The uid and gid of the test user, created when missing. */
function testUser() {
  try {
    execFileSync('id', ['-u', USER], { stdio: 'ignore' });
  } catch {
    execFileSync('useradd', ['--system', '--no-create-home', '--shell', '/usr/sbin/nologin', USER], { stdio: 'inherit' });
  }
  const uid = Number(execFileSync('id', ['-u', USER]).toString().trim());
  const gid = Number(execFileSync('id', ['-g', USER]).toString().trim());
  return { uid, gid };
}

/**
 * Connects to `socket` as `user`, sends hello, and says what happened:
 * `{connected, error, data, closed}`.
 */
function connectAs(user, socket) {
  const script = `
    const net = require('node:net');
    const out = { connected: false, error: null, data: '', closed: false };
    const s = net.createConnection(process.argv[1]);
    s.on('connect', () => { out.connected = true; s.write('{"jsonrpc":"2.0","id":1,"method":"hello"}\\n'); });
    s.on('data', (d) => { out.data += d; });
    s.on('error', (e) => { out.error = e.code || e.message; });
    s.on('close', () => { out.closed = true; done(); });
    const timer = setTimeout(done, 3000);
    function done() { clearTimeout(timer); process.stdout.write(JSON.stringify(out)); process.exit(0); }
  `;
  return new Promise((resolve, reject) => {
    const child = spawn(process.execPath, ['-e', script, socket], { uid: user.uid, gid: user.gid, cwd: '/', stdio: ['ignore', 'pipe', 'pipe'] });
    let stdout = '';
    let stderr = '';
    child.stdout.on('data', (d) => (stdout += d));
    child.stderr.on('data', (d) => (stderr += d));
    child.on('error', reject);
    child.on('close', () => {
      try {
        resolve(JSON.parse(stdout));
      } catch {
        reject(new Error(`no answer from the child: ${stdout} ${stderr}`));
      }
    });
  });
}

test('a peer of another user is refused: it cannot reach the socket, and the service closes its connection unanswered', { timeout: 30_000 }, async (t) => {
  if (process.platform === 'win32' || typeof process.getuid !== 'function' || process.getuid() !== 0) {
    t.skip('SKIPPED: the other-user test needs root, to create a user and run a client as it');
    return;
  }
  const user = testUser();
  const ctx = await Fixture.start(t);
  const socket = ctx.service.socket;

  assert.ok(socket.startsWith(ctx.dir + path.sep), `the socket ${socket} is not in the store`);
  const run = path.dirname(socket);
  assert.equal(fs.statSync(run).mode & 0o777, 0o700, `the socket's folder ${run} is not 0700`);
  // Every folder above it made reachable, for this test only.
  const above = [];
  for (let dir = path.dirname(run); dir.startsWith(ctx.dir); dir = path.dirname(dir)) above.push(dir);
  const modes = [...above, run, socket].map((p) => [p, fs.statSync(p).mode & 0o7777]);
  try {
    for (const folder of above) fs.chmodSync(folder, 0o711);
    // The socket's folder is the user's alone: another user cannot reach the socket.
    const blocked = await connectAs(user, socket);
    assert.equal(blocked.connected, false, `another user connected through the 0700 folder: ${JSON.stringify(blocked)}`);
    assert.equal(blocked.error, 'EACCES', JSON.stringify(blocked));

    // With the folder and the socket opened up too, the server's own check refuses it.
    fs.chmodSync(run, 0o711);
    fs.chmodSync(socket, 0o777);
    const refused = await connectAs(user, socket);
    assert.equal(refused.connected, true, `could not connect as ${USER} to test the server's check: ${JSON.stringify(refused)}`);
    assert.equal(refused.data, '', `the service answered another user: ${refused.data}`);
    assert.equal(refused.closed, true, 'the service kept the connection of another user open');
  } finally {
    for (const [p, mode] of modes) fs.chmodSync(p, mode);
  }

  // Its own user is served all along.
  const client = await ctx.connect();
  assert.equal((await client.hello()).protocol, 1);
});
