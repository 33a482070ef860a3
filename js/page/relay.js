#!/usr/bin/env node
// An example relay for a plain browser page, which has no Unix socket: it
// serves the gem page and a read-only feed of one gem (its status, and the
// events of a subscription as Server-Sent Events) on loopback, to a browser
// on this machine that holds its random token. Node, no dependencies.
//
//   node js/page/relay.js --store ~/.local/share/gem-resources --gem notes
//   → open http://127.0.0.1:PORT/TOKEN/page/index.html?gem=notes
//
// What it serves, and nothing else (GET and HEAD only):
//   /TOKEN/page/index.html, /TOKEN/page/gem-resources-page.js, /TOKEN/model.js
//   /TOKEN/feed/GEM/status   the gem's status: {"gems": [GemStatus]}
//   /TOKEN/feed/GEM/events   text/event-stream: `event: status` (the
//                            subscription's [GemStatus…]), then each event
//                            as a `message`; after `lagged` it subscribes
//                            again and sends `status` again; `event: lost`
//                            ({code, message}) and the end when the
//                            service is lost.
// Every request must name 127.0.0.1:PORT or localhost:PORT in `Host` (no
// DNS rebinding), come from the same origin or none (`Origin`,
// `Sec-Fetch-Site`), and start its path with the token: else 403. Any
// other path is 404. No path, install, policy or any call that changes
// the store: a page through the relay can only watch.
//
// Use it from code: `const relay = await startRelay({source: client, gem})`
// (any `source` with the client's `status(gem)` and `subscribe({gem})`).

import crypto from 'node:crypto';
import fs from 'node:fs';
import http from 'node:http';
import path from 'node:path';
import { fileURLToPath, pathToFileURL } from 'node:url';

const here = path.dirname(fileURLToPath(import.meta.url));

/** The files served, by their path after the token. */
const FILES = new Map([
  ['page/index.html', { file: path.join(here, 'index.html'), type: 'text/html; charset=utf-8' }],
  ['page/gem-resources-page.js', { file: path.join(here, 'gem-resources-page.js'), type: 'text/javascript; charset=utf-8' }],
  ['model.js', { file: path.join(here, '..', 'model.js'), type: 'text/javascript; charset=utf-8' }],
]);

/** At most this many event streams at once (each is a subscription of the service). */
const MAX_STREAMS = 16;
/** An event stream whose browser stops reading with this much unsent is ended (the page subscribes again and redraws). */
const MAX_UNSENT = 4 * 1024 * 1024;
/** How often a quiet event stream gets a comment line, so that nothing between closes it as idle (ms). */
const KEEPALIVE_MS = 15_000;

/**
 * JSON for the page: without the store's local paths (a file's `path`,
 * the gems folder in `installed_by`), which a page has no use for.
 */
function forPage(value) {
  return JSON.stringify(value, (key, v) => {
    if (key === 'path') return undefined;
    if (key === 'installed_by' && v && typeof v === 'object') return { kind: v.kind ?? null };
    return v;
  });
}

function sha256(text) {
  return crypto.createHash('sha256').update(text).digest();
}

/** The hashes of index.html's inline scripts, for its Content-Security-Policy. */
function inlineScriptHashes(html) {
  const hashes = [];
  for (const m of html.matchAll(/<script\b[^>]*>([\s\S]*?)<\/script>/g)) {
    if (m[1].trim() !== '') hashes.push(`'sha256-${sha256(m[1]).toString('base64')}'`);
  }
  return hashes;
}

/**
 * Starts the relay. `source`: the client (or anything with `status(gem)`
 * and `subscribe({gem})`); `gem`: the one gem it feeds. Listens on
 * 127.0.0.1 at `port` (0: a random free one) with a random token (or
 * `token`). Resolves to `{url, pageUrl, port, token, close()}`: `url` is
 * the base a page's `relay` attribute takes, `pageUrl` the page to open.
 */
export async function startRelay({ source, gem, port = 0, token = crypto.randomBytes(24).toString('hex') } = {}) {
  if (!source || typeof source.subscribe !== 'function' || typeof source.status !== 'function') {
    throw new TypeError('startRelay needs a source with status(gem) and subscribe({gem})');
  }
  if (typeof gem !== 'string' || gem === '') throw new TypeError('startRelay needs a gem');
  if (!/^[A-Za-z0-9_-]{16,}$/.test(token)) throw new TypeError('the token must be at least 16 letters, digits, - or _');
  const tokenHash = sha256(token);
  const streams = new Set();
  // A request without Host is refused by handle() (403), not by Node (400).
  const server = http.createServer({ requireHostHeader: false }, (req, res) => handle(req, res).catch((e) => fail(res, 500, `relay error: ${e.message}`)));
  server.on('clientError', (_e, socket) => socket.destroy());
  await new Promise((resolve, reject) => {
    server.once('error', reject);
    server.listen(port, '127.0.0.1', resolve);
  });
  const bound = server.address().port;
  const hosts = new Set([`127.0.0.1:${bound}`, `localhost:${bound}`]);

  function headers(type, extra = {}) {
    return {
      'content-type': type,
      'cache-control': 'no-store',
      'x-content-type-options': 'nosniff',
      // The token is in every path: never send it elsewhere.
      'referrer-policy': 'no-referrer',
      'cross-origin-resource-policy': 'same-origin',
      'x-frame-options': 'DENY',
      ...extra,
    };
  }

  function fail(res, status, message) {
    if (res.headersSent) {
      res.destroy();
      return;
    }
    res.writeHead(status, headers('text/plain; charset=utf-8')).end(`${message}\n`);
  }

  function tokenMatches(candidate) {
    return crypto.timingSafeEqual(sha256(candidate), tokenHash);
  }

  async function handle(req, res) {
    const host = String(req.headers.host ?? '').toLowerCase();
    if (!hosts.has(host)) return fail(res, 403, 'wrong Host: this relay answers only 127.0.0.1 and localhost on its port');
    const origin = req.headers.origin;
    if (origin !== undefined && origin !== `http://${host}`) return fail(res, 403, 'foreign Origin: this relay answers only its own pages');
    const site = req.headers['sec-fetch-site'];
    if (site !== undefined && site !== 'same-origin' && site !== 'none') return fail(res, 403, 'cross-site request refused');
    if (req.method !== 'GET' && req.method !== 'HEAD') {
      res.setHeader('allow', 'GET, HEAD');
      return fail(res, 405, 'read-only: GET and HEAD only');
    }
    let pathname;
    try {
      pathname = new URL(req.url, `http://${host}`).pathname;
    } catch {
      return fail(res, 404, 'not found');
    }
    const slash = pathname.indexOf('/', 1);
    const first = slash < 0 ? pathname.slice(1) : pathname.slice(1, slash);
    if (!tokenMatches(first)) return fail(res, 403, 'the token is missing or wrong');
    const rest = slash < 0 ? '' : pathname.slice(slash + 1);
    if (rest === '' || rest === 'page/') {
      res.writeHead(302, headers('text/plain; charset=utf-8', { location: `/${first}/page/index.html?gem=${encodeURIComponent(gem)}` }));
      return res.end();
    }
    const file = FILES.get(rest);
    if (file) return serveFile(req, res, file);
    const feed = /^feed\/([^/]+)\/(status|events)$/.exec(rest);
    let feedGem = null;
    try {
      feedGem = feed ? decodeURIComponent(feed[1]) : null;
    } catch {
      feedGem = null;
    }
    if (!feed || feedGem !== gem) return fail(res, 404, 'not found');
    if (feed[2] === 'status') {
      let status;
      try {
        status = await source.status(gem);
      } catch (e) {
        return fail(res, 503, `the service did not answer: ${e.message}`);
      }
      const gems = Array.isArray(status) ? status : (status.gems ?? []);
      const body = forPage({ gems: gems.filter((g) => g.gem === gem) });
      res.writeHead(200, headers('application/json'));
      return res.end(req.method === 'HEAD' ? undefined : body);
    }
    return events(req, res);
  }

  function serveFile(req, res, { file, type }) {
    let body = fs.readFileSync(file);
    const extra = {};
    if (type.startsWith('text/html')) {
      const scripts = inlineScriptHashes(body.toString('utf8'));
      extra['content-security-policy'] = [
        "default-src 'none'",
        `script-src 'self' ${scripts.join(' ')}`.trim(),
        "style-src 'self' 'unsafe-inline'",
        "connect-src 'self'",
        "img-src 'self' data:",
        "base-uri 'none'",
        "form-action 'none'",
        "frame-ancestors 'none'",
      ].join('; ');
    }
    res.writeHead(200, headers(type, extra));
    res.end(req.method === 'HEAD' ? undefined : body);
    body = null;
  }

  async function events(req, res) {
    if (streams.size >= MAX_STREAMS) return fail(res, 503, 'too many event streams');
    res.writeHead(200, headers('text/event-stream; charset=utf-8', { connection: 'keep-alive' }));
    if (req.method === 'HEAD') return res.end();
    const stream = { res, sub: null, closed: false };
    streams.add(stream);
    const keepalive = setInterval(() => send(': keep-alive\n\n'), KEEPALIVE_MS);
    const close = () => {
      if (stream.closed) return;
      stream.closed = true;
      clearInterval(keepalive);
      streams.delete(stream);
      try {
        stream.sub?.close();
      } catch {
        // closed already
      }
      res.end();
    };
    res.on('close', close);
    function send(text) {
      if (stream.closed) return;
      if (res.writableLength > MAX_UNSENT) {
        // The page stopped reading: end; it subscribes again and redraws.
        close();
        res.destroy();
        return;
      }
      res.write(text);
    }
    try {
      for (;;) {
        const sub = await source.subscribe({ gem });
        stream.sub = sub;
        if (stream.closed) return sub.close();
        send(`event: status\ndata: ${forPage(sub.status ?? [])}\n\n`);
        try {
          for await (const event of sub) {
            if (stream.closed) return;
            send(`data: ${forPage(event)}\n\n`);
          }
          break; // ended without error (closed)
        } catch (e) {
          if (e?.code !== 'E_RESOURCE_LAGGED' || stream.closed) throw e;
          // Fell behind: subscribe again, and send the new status.
        }
      }
      send(`event: lost\ndata: ${JSON.stringify({ code: 'E_RESOURCE_SERVICE', message: 'the subscription ended' })}\n\n`);
    } catch (e) {
      send(`event: lost\ndata: ${JSON.stringify({ code: e?.code ?? 'E_RESOURCE_SERVICE', message: String(e?.message ?? e) })}\n\n`);
    }
    close();
  }

  const base = `http://127.0.0.1:${bound}/${token}/`;
  return {
    url: base,
    pageUrl: `${base}page/index.html?gem=${encodeURIComponent(gem)}`,
    port: bound,
    token,
    server,
    async close() {
      for (const stream of [...streams]) {
        stream.res.destroy();
      }
      server.closeAllConnections?.();
      await new Promise((resolve) => server.close(() => resolve()));
    },
  };
}

function usage() {
  return 'usage: node relay.js --store DIR --gem GEM [--port N]\n  serves the gem page of GEM on 127.0.0.1, fed by the service of the store DIR';
}

async function main(argv) {
  const args = {};
  for (let i = 0; i < argv.length; i++) {
    const a = argv[i];
    if (a === '--help' || a === '-h') {
      console.log(usage());
      return;
    }
    if (!['--store', '--gem', '--port'].includes(a) || argv[i + 1] === undefined) {
      console.error(usage());
      process.exitCode = 2;
      return;
    }
    args[a.slice(2)] = argv[++i];
  }
  if (!args.store || !args.gem) {
    console.error(usage());
    process.exitCode = 2;
    return;
  }
  const { connect } = await import('../index.js');
  const client = await connect({ store: args.store });
  const relay = await startRelay({ source: client, gem: args.gem, port: Number(args.port ?? 0) });
  console.log(`gem page of ${args.gem}: ${relay.pageUrl}`);
  const stop = async () => {
    await relay.close();
    client.close();
    process.exit(0);
  };
  process.on('SIGINT', stop);
  process.on('SIGTERM', stop);
}

if (process.argv[1] && import.meta.url === pathToFileURL(fs.realpathSync(process.argv[1])).href) {
  main(process.argv.slice(2)).catch((e) => {
    console.error(`relay: ${e.message}`);
    process.exitCode = 1;
  });
}
