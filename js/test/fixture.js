// The one fixture of the end-to-end tests: a temporary folder (store, gems
// folder, config.toml), a local HTTPS origin for cdn.test, mirror.test and
// blocked.test that can misbehave on demand, a real `gem-resources serve`
// on that store, and the command line run as separate processes.
//
//   const ctx = await Fixture.start(t);          // cleaned up when `t` ends
//   const file = ctx.origin.add('a.bin', { size: 256 * 1024 });
//   await ctx.installGem('notes', [ctx.resource(file, { id: 'a' })]);
//   const client = await ctx.connect();
//
// Nothing here reaches beyond 127.0.0.1.

import { spawn } from 'node:child_process';
import crypto from 'node:crypto';
import fs from 'node:fs';
import https from 'node:https';
import net from 'node:net';
import os from 'node:os';
import path from 'node:path';
import readline from 'node:readline';
import { fileURLToPath } from 'node:url';

import { connect } from '../index.js';

const here = path.dirname(fileURLToPath(import.meta.url));
/** The repository's root (js/ is one of its folders). */
export const repoRoot = path.resolve(here, '..', '..');
/** The binary under test: $GEM_RESOURCES_BIN, else the debug build. */
export const binary = process.env.GEM_RESOURCES_BIN
  ? path.resolve(process.env.GEM_RESOURCES_BIN)
  : path.join(repoRoot, 'target', 'debug', process.platform === 'win32' ? 'gem-resources.exe' : 'gem-resources');
/** The origin's self-signed certificate (test-only; see fixtures/README.md). */
export const certFile = path.join(here, 'fixtures', 'cert.pem');
const keyFile = path.join(here, 'fixtures', 'key.pem');

/** The host names the origin answers for (all resolve to 127.0.0.1). */
export const HOSTS = ['cdn.test', 'mirror.test', 'blocked.test'];
/** An instant as the service writes it: RFC 3339, UTC, milliseconds. */
export const RFC3339_MS = /^\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}\.\d{3}Z$/;

/**
 * On Linux, every child is started through `setpriv --pdeathsig KILL`
 * (which then runs the program itself, with the same pid): the kernel kills
 * it if the test process dies without cleaning up.
 */
const setpriv = process.platform === 'linux' && ['/usr/bin/setpriv', '/bin/setpriv'].find((p) => fs.existsSync(p));

function spawnGuarded(bin, args, options) {
  return setpriv ? spawn(setpriv, ['--pdeathsig', 'KILL', '--', bin, ...args], options) : spawn(bin, args, options);
}

/** Every process a fixture started and has not seen exit, killed if the test runner leaves early. */
const living = new Set();
process.on('exit', () => {
  for (const child of living) {
    try {
      child.kill('SIGKILL');
    } catch {
      // already gone
    }
  }
});

export function sha256(bytes) {
  return crypto.createHash('sha256').update(bytes).digest('hex');
}

export function sleep(ms) {
  return new Promise((resolve) => setTimeout(resolve, ms));
}

/** Polls `check` until it returns a truthy value (returned), or fails after `timeout` ms saying `what`. */
export async function waitFor(what, check, { timeout = 10_000, every = 25 } = {}) {
  const end = Date.now() + timeout;
  let last;
  for (;;) {
    try {
      const value = await check();
      if (value) return value;
    } catch (e) {
      last = e;
    }
    if (Date.now() > end) {
      throw new Error(`timed out after ${timeout} ms waiting for ${what}${last ? ` (last error: ${last.message})` : ''}`);
    }
    await sleep(every);
  }
}

/** Races `promise` against a timer. */
export function within(ms, promise, what) {
  let timer;
  const timeout = new Promise((_, reject) => {
    timer = setTimeout(() => reject(new Error(`${what} did not settle within ${ms} ms`)), ms);
  });
  return Promise.race([promise, timeout]).finally(() => clearTimeout(timer));
}

/** A fresh folder of this user's alone (0700), with a short path (for sockets), removed when `t` ends. */
export function tempDir(t) {
  const dir = fs.mkdtempSync(path.join(os.tmpdir(), 'grjs-'));
  fs.chmodSync(dir, 0o700);
  t.after(() => fs.rmSync(dir, { recursive: true, force: true, maxRetries: 3 }));
  return dir;
}

/**
 * What a service holding `secret` answers to `hello` with `nonce`:
 * hex(HMAC-SHA256(key: the text of `secret`, message: "gem-resources hello\n" + nonce)).
 */
export function helloProof(secret, nonce) {
  return crypto.createHmac('sha256', secret).update(`gem-resources hello\n${nonce}`).digest('hex');
}

/**
 * A stand-in for a store's service, for tests of what a client sends before
 * it trusts one: a socket in a folder of its own (0700), a store whose
 * service.json names it (`writeServiceFile`), and a record of every
 * connection (`connections[i]`: `{socket, lines, requests, bytes, closed}`).
 * `answer(request, conn)` answers each request: a value is sent as the
 * result, `{error}` as an error, `undefined` sends nothing (the test writes
 * on `conn.socket` itself). `fake.hello(request)` is the answer of the true
 * service: its pid and, with a nonce, the proof of its `secret`.
 */
export class FakeService {
  static async start(t, answer) {
    const fake = new FakeService(tempDir(t), answer);
    await new Promise((resolve, reject) => {
      fake.server.once('error', reject);
      fake.server.listen(fake.socket, resolve);
    });
    t.after(async () => {
      for (const c of fake.connections) c.socket.destroy();
      await new Promise((resolve) => fake.server.close(resolve));
    });
    return fake;
  }

  constructor(dir, answer) {
    this.dir = dir;
    this.store = path.join(dir, 'store');
    this.run = path.join(dir, 'run');
    fs.mkdirSync(this.run, { mode: 0o700 });
    this.socket = path.join(this.run, 'api.sock');
    this.secret = crypto.randomBytes(32).toString('hex');
    this.pid = process.pid;
    this.connections = [];
    this.answer = answer;
    this.server = net.createServer((socket) => this.accept(socket));
  }

  accept(socket) {
    const conn = { socket, lines: [], requests: [], bytes: 0, closed: false };
    this.connections.push(conn);
    let buffer = '';
    socket.setEncoding('utf8');
    socket.on('error', () => {});
    socket.on('close', () => {
      conn.closed = true;
    });
    socket.on('data', async (chunk) => {
      conn.bytes += Buffer.byteLength(chunk);
      buffer += chunk;
      let nl;
      while ((nl = buffer.indexOf('\n')) >= 0) {
        const line = buffer.slice(0, nl);
        buffer = buffer.slice(nl + 1);
        conn.lines.push(line);
        let request;
        try {
          request = JSON.parse(line);
        } catch {
          continue;
        }
        conn.requests.push(request);
        const out = await this.answer(request, conn);
        if (out === undefined || socket.destroyed) continue;
        const reply = out && out.error ? { jsonrpc: '2.0', id: request.id, error: out.error } : { jsonrpc: '2.0', id: request.id, result: out };
        socket.write(JSON.stringify(reply) + '\n');
      }
    });
  }

  /** Writes `<store>/store-v1/service.json` (0600) naming this socket; `fields` override (undefined drops one). */
  writeServiceFile(fields = {}) {
    const layout = path.join(this.store, 'store-v1');
    fs.mkdirSync(layout, { recursive: true, mode: 0o700 });
    const info = { protocol: 1, socket: this.socket, pid: this.pid, version: '0.0.0-fake', secret: this.secret, ...fields };
    const file = path.join(layout, 'service.json');
    fs.writeFileSync(file, JSON.stringify(info), { mode: 0o600 });
    return info;
  }

  /** The true service's answer to `request` (a `hello`). */
  hello(request) {
    const result = { protocol: 1, version: '0.0.0-fake', store: this.store, pid: this.pid };
    const nonce = request.params?.nonce;
    if (typeof nonce === 'string') result.proof = helloProof(this.secret, nonce);
    return result;
  }
}

/** A TOML value of a plain JS value (strings, numbers, booleans, arrays of them, inline tables). */
function tomlValue(value) {
  if (typeof value === 'string') return JSON.stringify(value);
  if (typeof value === 'number' || typeof value === 'boolean') return String(value);
  if (Array.isArray(value)) return `[${value.map(tomlValue).join(', ')}]`;
  if (value && typeof value === 'object') {
    return `{ ${Object.entries(value).map(([k, v]) => `${JSON.stringify(k)} = ${tomlValue(v)}`).join(', ')} }`;
  }
  throw new TypeError(`no TOML for ${value}`);
}

function tomlTable(name, entries) {
  const lines = [`[${name}]`];
  for (const [key, value] of Object.entries(entries)) {
    if (value !== undefined) lines.push(`${key} = ${tomlValue(value)}`);
  }
  return lines.join('\n');
}

/**
 * The HTTPS origin: serves the files it is given, counts requests and bytes,
 * and misbehaves per file on demand (`behave`).
 */
export class Origin {
  constructor() {
    this.files = new Map();
    /** Every request: `{path, host, method, range, ifRange}`. */
    this.requests = [];
    /** Body bytes handed to the sockets, per path. */
    this.sent = new Map();
    /** Responses with a body under way, per path. */
    this.active = new Map();
    this.server = https.createServer(
      { key: fs.readFileSync(keyFile), cert: fs.readFileSync(certFile), keepAliveTimeout: 1000 },
      (req, res) => this.handle(req, res),
    );
    this.server.on('tlsClientError', () => {});
    this.port = 0;
  }

  async listen() {
    await new Promise((resolve, reject) => {
      this.server.once('error', reject);
      this.server.listen(0, '127.0.0.1', resolve);
    });
    this.port = this.server.address().port;
  }

  /** `https://<host>:<port>/<name>`. */
  url(name, host = 'cdn.test') {
    return `https://${host}:${this.port}/${name}`;
  }

  /**
   * Serves `name`: `size` random bytes (or `bytes`). Returns the file:
   * `{name, size, sha256, bytes, url(host?)}`.
   */
  add(name, { size, bytes } = {}) {
    const body = bytes ?? crypto.randomBytes(size);
    const file = {
      name,
      size: body.length,
      bytes: body,
      sha256: sha256(body),
      etag: `"${sha256(body).slice(0, 24)}"`,
      behavior: {},
      url: (host = 'cdn.test') => this.url(name, host),
    };
    this.files.set(name, file);
    return file;
  }

  /**
   * Changes how `name` is served, from the next chunk on: `rate` (bytes per
   * second, per response), `hold` (send the head, then no byte while true),
   * `status` (answer every request with this status and no file);
   * `hosts` (a list: the behavior holds only for requests to these hosts).
   * `undefined` values reset a setting.
   */
  behave(name, behavior) {
    const file = this.files.get(name);
    if (!file) throw new Error(`no file ${name}`);
    Object.assign(file.behavior, behavior);
  }

  /** Requests for `name`, optionally only those to `host` or with `method` (default GET). */
  requestCount(name, { host, method = 'GET' } = {}) {
    return this.requests.filter(
      (r) => r.path === `/${name}` && (host === undefined || r.host === host) && (method === undefined || r.method === method),
    ).length;
  }

  /** Requests to `host`, whatever the path. */
  hostRequests(host) {
    return this.requests.filter((r) => r.host === host).length;
  }

  bytesSent(name) {
    return this.sent.get(`/${name}`) ?? 0;
  }

  activeResponses(name) {
    return this.active.get(`/${name}`) ?? 0;
  }

  handle(req, res) {
    const url = new URL(req.url, 'https://origin.invalid');
    const host = String(req.headers.host ?? '').replace(/:\d+$/, '').toLowerCase();
    const record = {
      path: url.pathname,
      host,
      method: req.method,
      range: req.headers.range,
      ifRange: req.headers['if-range'],
    };
    this.requests.push(record);
    req.socket.on('error', () => {});
    const file = this.files.get(decodeURIComponent(url.pathname.slice(1)));
    if (!file) {
      res.writeHead(404, { 'content-type': 'text/plain' }).end('not here\n');
      return;
    }
    const behavior = !file.behavior.hosts || file.behavior.hosts.includes(host) ? file.behavior : {};
    if (behavior.status) {
      res.writeHead(behavior.status, { 'content-type': 'text/plain' }).end('failing on purpose\n');
      return;
    }
    let start = 0;
    let end = file.size - 1;
    let status = 200;
    const headers = { etag: file.etag, 'accept-ranges': 'bytes', 'content-type': 'application/octet-stream' };
    const range = req.headers.range && /^bytes=(\d*)-(\d*)$/.exec(req.headers.range.trim());
    const ifRange = req.headers['if-range'];
    if (range && (ifRange === undefined || ifRange === file.etag)) {
      if (range[1] === '') {
        start = Math.max(0, file.size - Number(range[2]));
      } else {
        start = Number(range[1]);
        if (range[2] !== '') end = Math.min(end, Number(range[2]));
      }
      if (start >= file.size || start > end) {
        res.writeHead(416, { 'content-range': `bytes */${file.size}` }).end();
        return;
      }
      status = 206;
      headers['content-range'] = `bytes ${start}-${end}/${file.size}`;
    }
    headers['content-length'] = String(end - start + 1);
    res.writeHead(status, headers);
    if (req.method === 'HEAD') {
      res.end();
      return;
    }
    this.stream(file, behavior, url.pathname, res, start, end + 1);
  }

  /** Sends bytes [start, end) of `file`, as `behavior` (read again before each chunk) says. */
  async stream(file, behavior, key, res, start, end) {
    // The file's behavior as it is now, unless it did not apply to this request.
    const live = () => (behavior === file.behavior ? file.behavior : {});
    this.active.set(key, (this.active.get(key) ?? 0) + 1);
    let gone = false;
    res.on('close', () => {
      gone = true;
    });
    const count = (n) => this.sent.set(key, (this.sent.get(key) ?? 0) + n);
    try {
      res.flushHeaders();
      let at = start;
      let windowStart = Date.now();
      let windowBytes = 0;
      let rateSeen = live().rate;
      while (at < end && !gone) {
        if (live().hold) {
          await sleep(20);
          windowStart = Date.now();
          windowBytes = 0;
          continue;
        }
        const rate = live().rate;
        if (rate !== rateSeen) {
          rateSeen = rate;
          windowStart = Date.now();
          windowBytes = 0;
        }
        if (!rate) {
          const chunk = file.bytes.subarray(at, end);
          count(chunk.length);
          at = end;
          if (!res.write(chunk)) await drained(res);
          break;
        }
        const size = Math.max(1024, Math.min(16 * 1024, Math.floor(rate / 20)));
        const chunk = file.bytes.subarray(at, Math.min(end, at + size));
        at += chunk.length;
        count(chunk.length);
        windowBytes += chunk.length;
        if (!res.write(chunk)) await drained(res);
        const due = windowStart + (windowBytes / rate) * 1000;
        const wait = due - Date.now();
        if (wait > 0) await sleep(wait);
      }
      if (!gone) res.end();
    } finally {
      this.active.set(key, this.active.get(key) - 1);
    }
  }

  async close() {
    for (const file of this.files.values()) file.behavior = {};
    this.server.closeAllConnections?.();
    await new Promise((resolve) => this.server.close(() => resolve()));
  }
}

function drained(res) {
  return new Promise((resolve) => {
    const done = () => {
      res.off('drain', done);
      res.off('close', done);
      resolve();
    };
    res.on('drain', done);
    res.on('close', done);
  });
}

/** A child process with its output collected: `{code, signal, stdout, stderr, json}`. */
function run(bin, args, { timeout = 30_000, env } = {}) {
  return new Promise((resolve, reject) => {
    const child = spawnGuarded(bin, args, { stdio: ['ignore', 'pipe', 'pipe'], env: { ...process.env, NO_COLOR: '1', ...env } });
    living.add(child);
    let stdout = '';
    let stderr = '';
    child.stdout.setEncoding('utf8').on('data', (d) => (stdout += d));
    child.stderr.setEncoding('utf8').on('data', (d) => (stderr += d));
    const timer = setTimeout(() => {
      child.kill('SIGKILL');
      reject(new Error(`${path.basename(bin)} ${args.join(' ')} ran over ${timeout} ms\nstderr: ${stderr}`));
    }, timeout);
    child.on('error', (e) => {
      clearTimeout(timer);
      living.delete(child);
      reject(e);
    });
    child.on('close', (code, signal) => {
      clearTimeout(timer);
      living.delete(child);
      let json;
      try {
        json = JSON.parse(stdout);
      } catch {
        json = undefined;
      }
      resolve({ code, signal, stdout, stderr, json });
    });
  });
}

/**
 * A bare connection to the service's socket, for tests that speak the
 * protocol by hand (malformed lines, a client that never reads).
 */
export class RawPeer {
  constructor(socket) {
    this.socket = socket;
    this.messages = [];
    this.buffer = '';
    this.ended = false;
    this.waiters = new Set();
    socket.setEncoding('utf8');
    socket.on('data', (chunk) => {
      this.buffer += chunk;
      let nl;
      while ((nl = this.buffer.indexOf('\n')) >= 0) {
        const line = this.buffer.slice(0, nl);
        this.buffer = this.buffer.slice(nl + 1);
        try {
          this.messages.push(JSON.parse(line));
        } catch {
          this.messages.push({ unparsable: line });
        }
      }
      this.wake();
    });
    socket.on('error', (e) => {
      this.error = e;
    });
    socket.on('close', () => {
      this.ended = true;
      this.wake();
    });
  }

  static open(socketPath) {
    return new Promise((resolve, reject) => {
      const socket = net.createConnection(socketPath);
      socket.once('error', reject);
      socket.once('connect', () => {
        socket.off('error', reject);
        resolve(new RawPeer(socket));
      });
    });
  }

  wake() {
    for (const w of this.waiters) w();
  }

  /** Writes text as is (no newline added). */
  write(text) {
    return new Promise((resolve) => {
      if (this.socket.destroyed) return resolve(false);
      this.socket.write(text, () => resolve(true));
    });
  }

  send(message) {
    return this.write(JSON.stringify(message) + '\n');
  }

  /** The first message (from the start) matching `pred`, waiting up to `timeout` ms for it. */
  waitFor(pred, timeout = 5000) {
    return new Promise((resolve, reject) => {
      const check = () => {
        const found = this.messages.find(pred);
        if (found) {
          cleanup();
          resolve(found);
        } else if (this.ended) {
          cleanup();
          reject(new Error(`the connection closed; messages so far: ${JSON.stringify(this.messages).slice(0, 500)}`));
        }
      };
      const timer = setTimeout(() => {
        cleanup();
        reject(new Error(`no matching message within ${timeout} ms; messages so far: ${JSON.stringify(this.messages).slice(0, 500)}`));
      }, timeout);
      const cleanup = () => {
        clearTimeout(timer);
        this.waiters.delete(check);
      };
      this.waiters.add(check);
      check();
    });
  }

  /** Resolves true once the peer closed the connection, false after `timeout` ms. */
  waitClosed(timeout = 5000) {
    return new Promise((resolve) => {
      if (this.ended) return resolve(true);
      const timer = setTimeout(() => {
        this.waiters.delete(check);
        resolve(false);
      }, timeout);
      const check = () => {
        if (this.ended) {
          clearTimeout(timer);
          this.waiters.delete(check);
          resolve(true);
        }
      };
      this.waiters.add(check);
    });
  }

  close() {
    this.socket.destroy();
  }
}

/** The running service: its process, its `listening` event, its output. */
class Service {
  constructor(child) {
    this.child = child;
    this.pid = child.pid;
    /** Parsed JSON lines of its stdout (events), in order. */
    this.events = [];
    this.stderr = '';
    this.exited = new Promise((resolve) => {
      child.on('exit', (code, signal) => {
        living.delete(child);
        this.exit = { code, signal };
        resolve(this.exit);
      });
    });
    child.stderr.setEncoding('utf8').on('data', (d) => {
      this.stderr = (this.stderr + d).slice(-20_000);
    });
    this.listening = new Promise((resolve, reject) => {
      const lines = readline.createInterface({ input: child.stdout });
      lines.on('line', (line) => {
        let event;
        try {
          event = JSON.parse(line);
        } catch {
          return;
        }
        if (this.events.length < 20_000) this.events.push(event);
        if (event && event.event === 'listening') resolve(event);
      });
      this.exited.then((exit) =>
        reject(new Error(`gem-resources serve exited (${JSON.stringify(exit)}) before listening; stderr:\n${this.stderr}`)),
      );
    });
  }

  /** SIGTERM, then the exit; SIGKILL after `grace` ms. */
  async stop(grace = 10_000) {
    if (this.exit) return this.exit;
    this.child.kill('SIGTERM');
    const timer = setTimeout(() => this.child.kill('SIGKILL'), grace);
    const exit = await this.exited;
    clearTimeout(timer);
    return exit;
  }
}

export class Fixture {
  /**
   * A fresh fixture, torn down when `t` (a node:test context) ends.
   * Options: `network` and `service` (extra keys of those config tables),
   * `serve` (default true: start the service now).
   */
  static async start(t, options = {}) {
    const ctx = new Fixture(options);
    t.after(() => ctx.close());
    await ctx.origin.listen();
    ctx.writeConfig();
    if (options.serve !== false) await ctx.startService();
    return ctx;
  }

  constructor(options) {
    this.options = options;
    this.dir = fs.mkdtempSync(path.join(os.tmpdir(), 'gr-js-'));
    this.store = path.join(this.dir, 'store');
    this.gems = path.join(this.dir, 'gems');
    this.configPath = path.join(this.dir, 'config.toml');
    fs.mkdirSync(this.gems, { mode: 0o700 });
    this.origin = new Origin();
    this.clients = new Set();
    this.peers = new Set();
    this.service = null;
  }

  writeConfig() {
    const resolve = Object.fromEntries(HOSTS.map((h) => [h, ['127.0.0.1']]));
    const network = { connect_timeout_secs: 5, retries: 0, ...this.options.network };
    const text = [
      tomlTable('network', network),
      tomlTable('service', { ...this.options.service }),
      tomlTable('dev', {
        extra_root_certs: [certFile],
        resolve,
        allow_addresses: ['127.0.0.1'],
      }),
      '',
    ].join('\n\n');
    fs.writeFileSync(this.configPath, text);
  }

  /** The arguments every run of the binary starts with. */
  baseArgs() {
    return ['--config', this.configPath, '--store', this.store];
  }

  /** Starts `gem-resources serve` and waits for its `listening` event. */
  async startService() {
    if (!fs.existsSync(binary)) {
      throw new Error(`no binary at ${binary}: build it with \`cargo build --bin gem-resources\`, or set GEM_RESOURCES_BIN`);
    }
    const child = spawnGuarded(binary, [...this.baseArgs(), '--json', 'serve', '--gems', this.gems, '--interval', '0.2'], {
      stdio: ['ignore', 'pipe', 'pipe'],
      env: { ...process.env, NO_COLOR: '1' },
    });
    living.add(child);
    const service = new Service(child);
    this.service = service;
    service.listening.catch(() => {});
    const listening = await within(15_000, service.listening, 'the `listening` event of gem-resources serve').catch(async (e) => {
      await service.stop(1000);
      throw new Error(`${e.message}\nstderr:\n${service.stderr}`);
    });
    service.socket = listening.socket;
    service.listeningEvent = listening;
    return service;
  }

  /** Stops the service with SIGTERM; its exit `{code, signal}`. */
  async stopService() {
    const exit = await this.service.stop();
    for (const client of this.clients) client.close();
    this.clients.clear();
    return exit;
  }

  /** A client of the service found from the store path; closed with the fixture. */
  async connect() {
    const client = await connect({ store: this.store });
    this.clients.add(client);
    return client;
  }

  /** A bare connection to the service's socket. */
  async raw() {
    const peer = await RawPeer.open(this.service.socket);
    this.peers.add(peer);
    return peer;
  }

  /** A manifest entry for an origin file. */
  resource(file, { id = file.name.replace(/\W/g, '-'), host = 'cdn.test', mirrors = [], required = false, description } = {}) {
    const entry = { id, url: file.url(host), mirrors, sha256: file.sha256, size: file.size, required };
    if (description !== undefined) entry.description = description;
    return entry;
  }

  /** A gem's manifest object. */
  manifest(gem, resources) {
    return { id: gem, name: gem, version: '1.0.0', resources };
  }

  /**
   * Installs `gem` with these resources through the API, which keeps it,
   * then writes its manifest in the gems folder too (which `serve` leaves
   * alone while the API keeps the gem). The install report.
   */
  async installGem(gem, resources, client) {
    const manifest = this.manifest(gem, resources);
    const c = client ?? (await this.connect());
    const report = await c.install(gem, manifest);
    const folder = path.join(this.gems, gem);
    fs.mkdirSync(folder, { recursive: true, mode: 0o700 });
    fs.writeFileSync(path.join(folder, 'notochord.json'), JSON.stringify(manifest, null, 2));
    return report;
  }

  /** Runs the command line (`--config`, `--store` given): `{code, signal, stdout, stderr, json}`. */
  cli(args, { json = true, timeout, env } = {}) {
    return run(binary, [...this.baseArgs(), ...(json ? ['--json'] : []), ...args], { timeout, env });
  }

  /** The service's events on its stdout so far, matching `pred`. */
  serviceEvents(pred = () => true) {
    return this.service ? this.service.events.filter(pred) : [];
  }

  async close() {
    for (const peer of this.peers) peer.close();
    for (const client of this.clients) client.close();
    if (this.service) await this.service.stop(5000);
    await this.origin.close();
    fs.rmSync(this.dir, { recursive: true, force: true, maxRetries: 3 });
  }
}
