// Helpers of the gem page's tests (model.test.js, page.test.js): a source
// of subscriptions the test drives by hand, status rows, a plain HTTP GET
// with any headers, and headless Chromium driven through the DevTools
// protocol over a pipe (no npm dependency, no debugging port).

import { spawn } from 'node:child_process';
import fs from 'node:fs';
import http from 'node:http';
import os from 'node:os';
import path from 'node:path';

/** A status row (`ResourceStatus`) with sensible defaults. */
export function statusRow(fields = {}) {
  const host = fields.host ?? 'cdn.test';
  const id = fields.id ?? 'model';
  const file = fields.file ?? `${id}.bin`;
  return {
    id,
    label: fields.description ?? id,
    file,
    size: 3 * 1024 * 1024,
    host,
    addresses: [`https://${host}:8443/${file}`],
    hosts: [host],
    required: false,
    sha256: '0'.repeat(64),
    state: 'missing',
    ...fields,
  };
}

/** One subscription of a FakeSource: `open(status)` resolves `subscribe`; `push`, `fail`, `end` feed it. */
class FakeSubscription {
  constructor(options, withStatus) {
    this.options = options;
    this.withStatus = withStatus;
    this.queue = [];
    this.waiters = [];
    this.done = false;
    this.error = null;
    this.closed = false;
    this.opened = new Promise((resolve, reject) => {
      this.resolveOpen = resolve;
      this.rejectOpen = reject;
    });
  }

  open(status) {
    if (this.withStatus) this.status = status;
    this.resolveOpen(this);
  }

  push(event) {
    const waiter = this.waiters.shift();
    if (waiter) waiter.resolve({ value: event, done: false });
    else this.queue.push(event);
  }

  fail(error) {
    this.finish(error);
  }

  end() {
    this.finish(null);
  }

  finish(error) {
    if (this.done) return;
    this.done = true;
    this.error = error;
    for (const waiter of this.waiters.splice(0)) {
      if (error) waiter.reject(error);
      else waiter.resolve({ value: undefined, done: true });
    }
  }

  next() {
    if (this.queue.length > 0) return Promise.resolve({ value: this.queue.shift(), done: false });
    if (this.done) return this.error ? Promise.reject(this.error) : Promise.resolve({ value: undefined, done: true });
    return new Promise((resolve, reject) => this.waiters.push({ resolve, reject }));
  }

  return() {
    this.close();
    return Promise.resolve({ value: undefined, done: true });
  }

  close() {
    this.closed = true;
    this.finish(null);
  }

  [Symbol.asyncIterator]() {
    return this;
  }
}

/** A source with the client's `status(gem)` and `subscribe({gem})` shapes, driven by the test. */
export class FakeSource {
  constructor({ withStatus = true, status = null } = {}) {
    this.withStatus = withStatus;
    this.statusValue = status;
    this.statusCalls = [];
    this.subscriptions = [];
    this.taken = 0;
    this.waiting = [];
  }

  async status(gem) {
    this.statusCalls.push(gem);
    return this.statusValue;
  }

  subscribe(options) {
    const sub = new FakeSubscription(options, this.withStatus);
    this.subscriptions.push(sub);
    const waiter = this.waiting.shift();
    if (waiter) {
      this.taken += 1;
      waiter(sub);
    }
    return sub.opened;
  }

  /** The next subscription asked for (waiting for it). */
  nextSubscription() {
    if (this.taken < this.subscriptions.length) return Promise.resolve(this.subscriptions[this.taken++]);
    return new Promise((resolve) => this.waiting.push(resolve));
  }
}

/** A GET (or `method`) to 127.0.0.1:`port` with exactly these headers: `{status, headers, body}`. */
export function request(port, pathname, { headers = {}, method = 'GET' } = {}) {
  return new Promise((resolve, reject) => {
    const req = http.request({ host: '127.0.0.1', port, path: pathname, method, headers, setHost: false, agent: false }, (res) => {
      let body = '';
      res.setEncoding('utf8');
      res.on('data', (d) => {
        body += d;
        if (res.headers['content-type']?.startsWith('text/event-stream')) {
          // A stream: what came first is enough.
          res.destroy();
          resolve({ status: res.statusCode, headers: res.headers, body });
        }
      });
      res.on('end', () => resolve({ status: res.statusCode, headers: res.headers, body }));
      res.on('error', () => {});
    });
    req.on('error', reject);
    req.end();
  });
}

/**
 * Opens a link of the relay (its one-time token) as a browser would:
 * the `Cookie` header its answer sets (`name=value`). Fails unless the
 * answer is a redirect to the same path without the token.
 */
export async function signIn(relay, link) {
  const url = new URL(link);
  const r = await request(relay.port, `${url.pathname}${url.search}`, { headers: { host: url.host } });
  if (r.status !== 302) throw new Error(`the link answered ${r.status}: ${r.body}`);
  const setCookie = r.headers['set-cookie']?.[0];
  if (!setCookie) throw new Error('the link set no cookie');
  return setCookie.split(';')[0];
}

/**
 * Reads an event stream of the relay: `{next(pred) → the next message
 * matching, messages, close()}`; each message `{event, data}`.
 */
export function eventStream(port, pathname, headers) {
  return new Promise((resolve, reject) => {
    const req = http.request({ host: '127.0.0.1', port, path: pathname, headers, setHost: false, agent: false }, (res) => {
      if (res.statusCode !== 200) {
        reject(new Error(`event stream answered ${res.statusCode}`));
        res.resume();
        return;
      }
      const messages = [];
      const waiters = new Set();
      let buffer = '';
      let ended = false;
      res.setEncoding('utf8');
      res.on('data', (d) => {
        buffer += d;
        let end;
        while ((end = buffer.indexOf('\n\n')) >= 0) {
          const block = buffer.slice(0, end);
          buffer = buffer.slice(end + 2);
          const message = { event: 'message', data: '' };
          const data = [];
          for (const line of block.split('\n')) {
            if (line.startsWith(':')) continue;
            const colon = line.indexOf(':');
            const field = colon < 0 ? line : line.slice(0, colon);
            const value = colon < 0 ? '' : line.slice(colon + 1).replace(/^ /, '');
            if (field === 'event') message.event = value;
            if (field === 'data') data.push(value);
          }
          if (data.length === 0) continue;
          message.data = JSON.parse(data.join('\n'));
          messages.push(message);
        }
        for (const w of [...waiters]) w();
      });
      res.on('end', () => {
        ended = true;
        for (const w of [...waiters]) w();
      });
      res.on('error', () => {});
      let read = 0;
      resolve({
        messages,
        headers: res.headers,
        get ended() {
          return ended;
        },
        next(pred = () => true, timeout = 10_000) {
          return new Promise((ok, fail) => {
            const check = () => {
              while (read < messages.length) {
                const m = messages[read++];
                if (pred(m)) {
                  cleanup();
                  ok(m);
                  return;
                }
              }
              if (ended) {
                cleanup();
                fail(new Error(`the stream ended; messages: ${JSON.stringify(messages).slice(0, 500)}`));
              }
            };
            const timer = setTimeout(() => {
              cleanup();
              fail(new Error(`no matching message within ${timeout} ms; messages: ${JSON.stringify(messages).slice(0, 500)}`));
            }, timeout);
            const cleanup = () => {
              clearTimeout(timer);
              waiters.delete(check);
            };
            waiters.add(check);
            check();
          });
        },
        close() {
          res.destroy();
          req.destroy();
        },
      });
    });
    req.on('error', reject);
    req.end();
  });
}

/** Chromium's path: $CHROMIUM, else the first of the usual ones that exists; null when none. */
export function findChromium() {
  if (process.env.CHROMIUM) return fs.existsSync(process.env.CHROMIUM) ? process.env.CHROMIUM : null;
  const candidates = ['/usr/bin/chromium', '/usr/bin/chromium-browser', '/usr/bin/google-chrome', '/usr/bin/google-chrome-stable', '/snap/bin/chromium'];
  return candidates.find((p) => fs.existsSync(p)) ?? null;
}

/**
 * Headless Chromium driven over `--remote-debugging-pipe`: the DevTools
 * protocol's JSON messages, each ended by a NUL byte, written on fd 3 and
 * read on fd 4. Nothing listens on a port.
 */
export class Chromium {
  static async launch(t, executable) {
    const dir = fs.mkdtempSync(path.join(os.tmpdir(), 'grjs-chromium-'));
    const args = [
      '--headless',
      '--remote-debugging-pipe',
      `--user-data-dir=${dir}`,
      '--no-first-run',
      '--no-default-browser-check',
      '--disable-gpu',
      '--disable-dev-shm-usage',
      '--disable-background-networking',
      '--disable-component-update',
      '--disable-sync',
      '--disable-extensions',
      '--no-proxy-server',
      '--hide-scrollbars',
      '--force-color-profile=srgb',
      '--font-render-hinting=none',
      'about:blank',
    ];
    // As root Chromium refuses to start without it.
    if (process.getuid?.() === 0) args.unshift('--no-sandbox');
    const child = spawn(executable, args, { stdio: ['ignore', 'pipe', 'pipe', 'pipe', 'pipe'] });
    const browser = new Chromium(child, dir);
    t.after(() => browser.close());
    await browser.send('Browser.getVersion');
    return browser;
  }

  constructor(child, dir) {
    this.child = child;
    this.dir = dir;
    this.nextId = 1;
    this.pending = new Map();
    this.listeners = new Set();
    this.stderr = '';
    this.exited = new Promise((resolve) => child.on('exit', resolve));
    child.stdout.resume();
    child.stderr.setEncoding('utf8').on('data', (d) => {
      this.stderr = (this.stderr + d).slice(-8000);
    });
    let buffer = Buffer.alloc(0);
    child.stdio[4].on('data', (chunk) => {
      buffer = Buffer.concat([buffer, chunk]);
      let end;
      while ((end = buffer.indexOf(0)) >= 0) {
        const message = JSON.parse(buffer.subarray(0, end).toString('utf8'));
        buffer = buffer.subarray(end + 1);
        if (message.id !== undefined && this.pending.has(message.id)) {
          const { resolve, reject, method } = this.pending.get(message.id);
          this.pending.delete(message.id);
          if (message.error) reject(new Error(`${method}: ${message.error.message}`));
          else resolve(message.result);
        } else {
          for (const l of [...this.listeners]) l(message);
        }
      }
    });
    child.stdio[3].on('error', () => {});
    child.stdio[4].on('error', () => {});
    child.on('exit', () => {
      for (const { reject, method } of this.pending.values()) reject(new Error(`${method}: Chromium exited\n${this.stderr}`));
      this.pending.clear();
    });
  }

  send(method, params = {}, sessionId) {
    return new Promise((resolve, reject) => {
      if (this.child.exitCode !== null) {
        reject(new Error(`${method}: Chromium exited\n${this.stderr}`));
        return;
      }
      const id = this.nextId++;
      this.pending.set(id, { resolve, reject, method });
      this.child.stdio[3].write(`${JSON.stringify({ id, method, params, ...(sessionId ? { sessionId } : {}) })}\0`);
    });
  }

  /** A new tab of `width` × `height` CSS pixels: a Page. */
  async newPage({ width = 800, height = 600, isolated = false } = {}) {
    // Isolated: a browser context of its own (its own cookies), as another user's browser.
    const context = isolated ? await this.send('Target.createBrowserContext') : null;
    const { targetId } = await this.send('Target.createTarget', { url: 'about:blank', ...(context ? { browserContextId: context.browserContextId } : {}) });
    const { sessionId } = await this.send('Target.attachToTarget', { targetId, flatten: true });
    const page = new Page(this, sessionId);
    await page.send('Runtime.enable');
    await page.send('Page.enable');
    await page.resize(width, height);
    return page;
  }

  async close() {
    if (this.child.exitCode === null) {
      const timer = setTimeout(() => this.child.kill('SIGKILL'), 5000);
      await this.send('Browser.close').catch(() => {});
      await this.exited;
      clearTimeout(timer);
    }
    fs.rmSync(this.dir, { recursive: true, force: true, maxRetries: 3 });
  }
}

export class Page {
  constructor(browser, sessionId) {
    this.browser = browser;
    this.sessionId = sessionId;
    /** What the page wrote to its console, and its uncaught exceptions. */
    this.logs = [];
    browser.listeners.add((m) => {
      if (m.sessionId !== sessionId) return;
      if (m.method === 'Runtime.consoleAPICalled') {
        this.logs.push(`console.${m.params.type}: ${m.params.args.map((a) => a.value ?? a.description).join(' ')}`);
      } else if (m.method === 'Runtime.exceptionThrown') {
        const d = m.params.exceptionDetails;
        this.logs.push(`exception: ${d.exception?.description ?? d.text}`);
      } else if (m.method === 'Log.entryAdded') {
        this.logs.push(`log.${m.params.entry.level}: ${m.params.entry.text}${m.params.entry.url ? ` (${m.params.entry.url})` : ''}`);
      }
    });
  }

  send(method, params) {
    return this.browser.send(method, params, this.sessionId);
  }

  resize(width, height) {
    return this.send('Emulation.setDeviceMetricsOverride', { width, height, deviceScaleFactor: 1, mobile: false });
  }

  async goto(url) {
    await this.send('Log.enable');
    const { errorText } = await this.send('Page.navigate', { url });
    if (errorText) throw new Error(`navigating to ${url}: ${errorText}`);
  }

  /** The value of `expression` (awaited when a promise), evaluated in the page. */
  async evaluate(expression) {
    const { result, exceptionDetails } = await this.send('Runtime.evaluate', { expression, returnByValue: true, awaitPromise: true });
    if (exceptionDetails) throw new Error(`in the page: ${exceptionDetails.exception?.description ?? exceptionDetails.text}`);
    return result.value;
  }

  /** Polls `expression` until it is truthy (returned), or fails after `timeout` ms saying `what`. */
  async waitFor(what, expression, { timeout = 15_000, every = 50 } = {}) {
    const end = Date.now() + timeout;
    let last;
    let error;
    for (;;) {
      try {
        last = await this.evaluate(expression);
        if (last) return last;
      } catch (e) {
        error = e;
      }
      if (Date.now() > end) {
        throw new Error(
          `timed out after ${timeout} ms waiting for ${what} (last value: ${JSON.stringify(last)}${error ? `, last error: ${error.message}` : ''})\npage logs:\n${this.logs.join('\n')}`,
        );
      }
      await new Promise((resolve) => setTimeout(resolve, every));
    }
  }

  /** A PNG of the page at its current width, as tall as the document (or `height`). */
  async screenshot(file, { height } = {}) {
    const { cssContentSize, contentSize } = await this.send('Page.getLayoutMetrics');
    const size = cssContentSize ?? contentSize;
    const h = height ?? Math.ceil(size.height);
    const w = Math.ceil(size.width);
    const { data } = await this.send('Page.captureScreenshot', {
      format: 'png',
      captureBeyondViewport: true,
      clip: { x: 0, y: 0, width: w, height: h, scale: 1 },
    });
    fs.mkdirSync(path.dirname(file), { recursive: true });
    fs.writeFileSync(file, Buffer.from(data, 'base64'));
    return file;
  }
}
