#!/usr/bin/env node
// An example relay for a plain browser page, which has no Unix socket: it
// serves the gem page and a read-only feed of one or several gems (their
// status, and the events of a subscription as Server-Sent Events) on
// loopback, to a browser on this machine that opened one of its links.
// Node, no dependencies.
//
//   node js/page/relay.js --store ~/.local/share/gem-resources --gem notes --app-name Notes
//   → open http://127.0.0.1:PORT/page/index.html?gem=notes&token=TOKEN
//
// A link's token is good once: the first request with it gets an
// HttpOnly, SameSite=Strict cookie and a redirect to the same path without
// the token; later requests need the cookie. A used token is refused (403).
//
// What it serves, and nothing else (GET and HEAD only):
//   /page/index.html, /page/gem-resources-page.js, /model.js
//   /feed/GEM/status   the gem's status: {"gems": [GemStatus]}
//   /feed/GEM/events   text/event-stream: `event: relay` ({app, gem, actions}), `event:
//                      status` (the subscription's [GemStatus…]), then each
//                      event as a `message`; after `lagged` it subscribes
//                      again and sends `status` again; `event: lost`
//                      ({code, message, app}) and the end when the service
//                      is lost.
// While the service is away, both feeds answer 503 at once with
// {code, message, app}; the relay tries the service again every second.
// Every request must name 127.0.0.1:PORT or localhost:PORT in `Host` (no
// DNS rebinding), come from the same origin or none (`Origin`,
// `Sec-Fetch-Site`), and carry the cookie (or a link's unused token):
// else 403. Any other path is 404. No path, install, policy or any call
// that changes the store: by default a page through the relay can only
// watch, and a POST is refused (405).
//
// Only when the app enables them (`actions: true`, or a list of
// 'retry', 'downloadNow', 'cancel'; `--actions` on the command line), the
// page's buttons may ask for them:
//   POST /act/GEM/ID/retry | download-now | cancel   → {"changed": bool}
// guarded as the reads are (Host, the cookie), and more: the request must
// carry `Origin` naming the relay itself (a browser sends it with every
// POST) and no `Sec-Fetch-Site` but same-origin. The `relay` event of the
// feed says which actions are allowed (`actions`).
//
// Use it from code: `const relay = await startRelay({source: client, gems, appName, actions})`
// (any `source` with the client's `status(gem)` and `subscribe({gem})`, and
// `retry(gem, id)`, `downloadNow(gem, id)`, `cancel(gem, id)` for actions).

import crypto from 'node:crypto';
import fs from 'node:fs';
import http from 'node:http';
import path from 'node:path';
import { fileURLToPath, pathToFileURL } from 'node:url';

const here = path.dirname(fileURLToPath(import.meta.url));

/** The files served, by their path. */
const FILES = new Map([
  ['page/index.html', { file: path.join(here, 'index.html'), type: 'text/html; charset=utf-8' }],
  ['page/gem-resources-page.js', { file: path.join(here, 'gem-resources-page.js'), type: 'text/javascript; charset=utf-8' }],
  ['model.js', { file: path.join(here, '..', 'model.js'), type: 'text/javascript; charset=utf-8' }],
]);

/** The actions an app may enable, by their path under /act/GEM/ID/. */
const ACTIONS = new Map([
  ['retry', 'retry'],
  ['download-now', 'downloadNow'],
  ['cancel', 'cancel'],
]);

/** At most this many event streams at once (each is a subscription of the service). */
export const MAX_STREAMS = 16;
/** At most this many event streams of one client (one browser's cookie) at once. */
export const MAX_STREAMS_PER_CLIENT = 4;
/** An event stream whose browser stops reading with this much unsent is ended (the page subscribes again and redraws). */
const MAX_UNSENT = 4 * 1024 * 1024;
/** How often a quiet event stream gets a comment line, so that nothing between closes it as idle (ms). */
const KEEPALIVE_MS = 15_000;
/** How often the relay tries the service again while it is away (ms). */
const PROBE_MS = 1000;
/** The code of a lost service (the client's). */
const SERVICE = 'E_RESOURCE_SERVICE';

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

function secret() {
  return crypto.randomBytes(24).toString('hex');
}

/** The hashes of index.html's inline scripts, for its Content-Security-Policy. */
function inlineScriptHashes(html) {
  const hashes = [];
  for (const m of html.matchAll(/<script\b[^>]*>([\s\S]*?)<\/script>/g)) {
    if (m[1].trim() !== '') hashes.push(`'sha256-${sha256(m[1]).toString('base64')}'`);
  }
  return hashes;
}

/** A gem id the relay feeds when it serves any gem: 1 to 128 characters, no control character nor `/`. */
function plausibleGem(gem) {
  return typeof gem === 'string' && gem.length >= 1 && gem.length <= 128 && !/[\u0000-\u001f\u007f/]/.test(gem);
}

/** The value of cookie `name` in a `Cookie` header, or null. */
function cookieOf(header, name) {
  for (const part of String(header ?? '').split(';')) {
    const eq = part.indexOf('=');
    if (eq > 0 && part.slice(0, eq).trim() === name) return part.slice(eq + 1).trim();
  }
  return null;
}

/**
 * Starts the relay. `source`: the client (or anything with `status(gem)`
 * and `subscribe({gem})`; a client's 'disconnected' and 'reconnected' are
 * listened to); `gems`: the gems it feeds (or `gem`, one; neither: any
 * gem); `appName`: the app's name, which the page says when the service is
 * away. Listens on 127.0.0.1 at `port` (0: a random free one). Resolves to
 * `{url, pageUrl, port, token, newPageUrl(gem), close()}`: `pageUrl` opens
 * the first gem's page once (its `token`); `newPageUrl(gem)` makes another
 * link, good once too. `actions`: false (the default: read-only), true
 * (retry, download now and cancel) or a list of 'retry', 'downloadNow',
 * 'cancel': the POSTs the page's buttons may make, each calling the
 * source's method of that name with (gem, id).
 */
export async function startRelay({ source, gem, gems, appName, actions = false, port = 0, token = secret() } = {}) {
  if (!source || typeof source.subscribe !== 'function' || typeof source.status !== 'function') {
    throw new TypeError('startRelay needs a source with status(gem) and subscribe({gem})');
  }
  let list = gems ?? (gem === undefined ? null : [gem]);
  if (list !== null) {
    if (!Array.isArray(list) || list.length === 0 || !list.every((g) => typeof g === 'string' && g !== '')) {
      throw new TypeError('startRelay needs gems: a list of gem ids (or none, for any gem)');
    }
    list = [...new Set(list)];
  }
  if (appName !== undefined && (typeof appName !== 'string' || appName.trim() === '')) throw new TypeError('startRelay: appName must be a non-empty string');
  const known = [...ACTIONS.values()];
  const allowed = actions === true ? known : actions === false || actions === undefined || actions === null ? [] : actions;
  if (!Array.isArray(allowed) || !allowed.every((a) => known.includes(a))) {
    throw new TypeError(`startRelay: actions must be true, false or a list of ${known.join(', ')}`);
  }
  for (const a of allowed) {
    if (typeof source[a] !== 'function') throw new TypeError(`startRelay: actions include ${a}, which the source has no method for`);
  }
  const app = appName ?? null;
  if (!/^[A-Za-z0-9_-]{16,}$/.test(token)) throw new TypeError('the token must be at least 16 letters, digits, - or _');
  /** Each link's token (by its hash): whether it was used. */
  const tokens = new Map([[sha256(token).toString('hex'), { used: false }]]);
  /** Each client (a browser's cookie, by its hash): its event streams. */
  const clients = new Map();
  const streams = new Set();
  /** The service is away: `{code, message, since}`, or null. */
  let outage = null;
  let probing = null;
  let probeTimer = null;
  // A request without Host is refused by handle() (403), not by Node (400).
  const server = http.createServer({ requireHostHeader: false }, (req, res) => handle(req, res).catch((e) => fail(res, 500, `relay error: ${e.message}`)));
  server.on('clientError', (_e, socket) => socket.destroy());
  await new Promise((resolve, reject) => {
    server.once('error', reject);
    server.listen(port, '127.0.0.1', resolve);
  });
  const bound = server.address().port;
  const hosts = new Set([`127.0.0.1:${bound}`, `localhost:${bound}`]);
  // Cookies are kept per host, not per port: the port names this relay's.
  const cookieName = `gem_relay_${bound}`;

  const emitter = typeof source.on === 'function' && typeof (source.off ?? source.removeListener) === 'function';
  const onDisconnected = (error) => serviceLost(error);
  const onReconnected = () => serviceBack();
  if (emitter) {
    source.on('disconnected', onDisconnected);
    source.on('reconnected', onReconnected);
  }

  /** The service went away: every stream is told at once and ended; feeds answer 503 until it is back. */
  function serviceLost(error) {
    const message = String(error?.message ?? error ?? 'the service went away');
    if (outage) {
      outage.message = message;
    } else {
      outage = { code: SERVICE, message, since: new Date().toISOString() };
      for (const stream of [...streams]) stream.lose(outage);
    }
    if (!probeTimer) {
      probeTimer = setInterval(probe, PROBE_MS);
      probeTimer.unref?.();
    }
  }

  function serviceBack() {
    outage = null;
    clearInterval(probeTimer);
    probeTimer = null;
  }

  /** Asks the service something small; back when it answers. */
  function probe() {
    if (probing || !outage) return;
    const ask = typeof source.hello === 'function' ? () => source.hello() : () => source.status(list?.[0]);
    probing = Promise.resolve()
      .then(ask)
      .then(serviceBack, (e) => {
        if (outage && e?.message) outage.message = e.message;
      })
      .finally(() => {
        probing = null;
      });
  }

  function headers(type, extra = {}) {
    return {
      'content-type': type,
      'cache-control': 'no-store',
      'x-content-type-options': 'nosniff',
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

  /** A refused feed: JSON a page reads (`{code, message, app}`). */
  function failFeed(res, status, code, message, extra = {}) {
    if (res.headersSent) {
      res.destroy();
      return;
    }
    res.writeHead(status, headers('application/json', extra)).end(JSON.stringify({ code, message, app }));
  }

  /** A new link's token, good once. */
  function mint() {
    const fresh = secret();
    tokens.set(sha256(fresh).toString('hex'), { used: false });
    return fresh;
  }

  function pageUrlOf(gemId, withToken) {
    const query = gemId === undefined ? '' : `gem=${encodeURIComponent(gemId)}&`;
    return `http://127.0.0.1:${bound}/page/index.html?${query}token=${withToken}`;
  }

  async function handle(req, res) {
    const host = String(req.headers.host ?? '').toLowerCase();
    if (!hosts.has(host)) return fail(res, 403, 'wrong Host: this relay answers only 127.0.0.1 and localhost on its port');
    const origin = req.headers.origin;
    if (origin !== undefined && origin !== `http://${host}`) return fail(res, 403, 'foreign Origin: this relay answers only its own pages');
    const site = req.headers['sec-fetch-site'];
    if (site !== undefined && site !== 'same-origin' && site !== 'none') return fail(res, 403, 'cross-site request refused');
    const posting = req.method === 'POST' && allowed.length > 0;
    if (req.method !== 'GET' && req.method !== 'HEAD' && !posting) {
      res.setHeader('allow', 'GET, HEAD');
      return fail(res, 405, 'read-only: GET and HEAD only (the app has not enabled the page\'s actions)');
    }
    // A POST must say where it comes from: the relay's own page.
    if (posting && (origin !== `http://${host}` || (site !== undefined && site !== 'same-origin'))) {
      return fail(res, 403, 'an action must come from the relay\'s own page (Origin)');
    }
    let url;
    try {
      url = new URL(req.url, `http://${host}`);
    } catch {
      return fail(res, 404, 'not found');
    }
    const cookie = cookieOf(req.headers.cookie, cookieName);
    const clientKey = cookie ? sha256(cookie).toString('hex') : null;
    let client = clientKey ? clients.get(clientKey) : undefined;
    const linkToken = url.searchParams.get('token');
    if (linkToken !== null) {
      // A link: its token is exchanged for a cookie, once.
      const entry = tokens.get(sha256(linkToken).toString('hex'));
      url.searchParams.delete('token');
      const location = `${url.pathname}${url.search}`;
      if (entry && !entry.used) {
        entry.used = true;
        if (!client) {
          const fresh = crypto.randomBytes(32).toString('hex');
          client = { streams: new Set() };
          clients.set(sha256(fresh).toString('hex'), client);
          res.setHeader('set-cookie', `${cookieName}=${fresh}; Path=/; HttpOnly; SameSite=Strict`);
        }
      } else if (!client) {
        return fail(res, 403, entry ? 'this link was used already: each link of the relay opens once; ask the app for a new one' : 'the token is wrong');
      }
      res.writeHead(302, headers('text/plain; charset=utf-8', { location }));
      return res.end();
    }
    if (!client) return fail(res, 403, 'no cookie of this relay: open the page through a link the app gave');
    const rest = url.pathname.slice(1);
    if (posting) return act(req, res, rest);
    if (rest === '' || rest === 'page' || rest === 'page/') {
      const query = list ? `?gem=${encodeURIComponent(list[0])}` : '';
      res.writeHead(302, headers('text/plain; charset=utf-8', { location: `/page/index.html${query}` }));
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
    if (!feed || !(list ? list.includes(feedGem) : plausibleGem(feedGem))) return fail(res, 404, 'not found');
    if (outage) {
      probe();
      return failFeed(res, 503, outage.code, outage.message, { 'retry-after': '1' });
    }
    if (feed[2] === 'status') {
      let status;
      try {
        status = await source.status(feedGem);
      } catch (e) {
        if ((e?.code ?? SERVICE) === SERVICE) serviceLost(e);
        return failFeed(res, 503, e?.code ?? SERVICE, `the service did not answer: ${e?.message ?? e}`);
      }
      const gemsOf = Array.isArray(status) ? status : (status.gems ?? []);
      const body = forPage({ gems: gemsOf.filter((g) => g.gem === feedGem) });
      res.writeHead(200, headers('application/json'));
      return res.end(req.method === 'HEAD' ? undefined : body);
    }
    return events(req, res, feedGem, client);
  }

  /** POST /act/GEM/ID/ACTION: the source's method, when the app allowed it. */
  async function act(req, res, rest) {
    req.resume(); // no body is read
    const m = /^act\/([^/]+)\/([^/]+)\/([a-z-]+)$/.exec(rest);
    let actGem = null;
    let id = null;
    try {
      actGem = m ? decodeURIComponent(m[1]) : null;
      id = m ? decodeURIComponent(m[2]) : null;
    } catch {
      actGem = null;
    }
    if (!m || !(list ? list.includes(actGem) : plausibleGem(actGem)) || !id) return fail(res, 404, 'not found');
    const method = ACTIONS.get(m[3]);
    if (!method) return fail(res, 404, 'not found');
    if (!allowed.includes(method)) {
      res.setHeader('allow', 'GET, HEAD');
      return fail(res, 405, `the app has not enabled ${method} on this page`);
    }
    if (outage) {
      probe();
      return failFeed(res, 503, outage.code, outage.message, { 'retry-after': '1' });
    }
    let answer;
    try {
      answer = await source[method](actGem, id);
    } catch (e) {
      const code = e?.code ?? SERVICE;
      if (code === SERVICE) serviceLost(e);
      const status = code === SERVICE ? 503 : code === 'E_RESOURCE_NOT_FOUND' ? 404 : 409;
      return failFeed(res, status, code, String(e?.message ?? e));
    }
    res.writeHead(200, headers('application/json'));
    return res.end(JSON.stringify({ changed: Boolean(answer?.changed ?? answer) }));
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

  async function events(req, res, feedGem, client) {
    if (req.method === 'HEAD') {
      res.writeHead(200, headers('text/event-stream; charset=utf-8'));
      return res.end();
    }
    if (client.streams.size >= MAX_STREAMS_PER_CLIENT) {
      return failFeed(res, 429, 'E_RESOURCE_BUSY', `this browser holds ${MAX_STREAMS_PER_CLIENT} event streams of the relay already: close a page of it`, { 'retry-after': '5' });
    }
    if (streams.size >= MAX_STREAMS) {
      return failFeed(res, 503, 'E_RESOURCE_BUSY', `the relay serves ${MAX_STREAMS} event streams already`, { 'retry-after': '5' });
    }
    const stream = { res, sub: null, closed: false, client, lose: null };
    // Counted before the service answers, so that slow answers cannot pass the caps.
    streams.add(stream);
    client.streams.add(stream);
    let keepalive = null;
    const close = () => {
      if (stream.closed) return;
      stream.closed = true;
      clearInterval(keepalive);
      streams.delete(stream);
      client.streams.delete(stream);
      try {
        stream.sub?.close();
      } catch {
        // closed already
      }
      if (res.headersSent) res.end();
    };
    res.on('close', close);
    function send(text) {
      if (stream.closed || !res.headersSent) return;
      if (res.writableLength > MAX_UNSENT) {
        // The page stopped reading: end; it subscribes again and redraws.
        close();
        res.destroy();
        return;
      }
      res.write(text);
    }
    const lostMessage = (code, message) => `event: lost\ndata: ${JSON.stringify({ code, message, app })}\n\n`;
    stream.lose = (why) => {
      if (!res.headersSent) {
        // Still waiting for the service: answered as a page opened now is.
        close();
        failFeed(res, 503, why.code, why.message);
        return;
      }
      send(lostMessage(why.code, why.message));
      close();
    };
    try {
      for (;;) {
        const sub = await source.subscribe({ gem: feedGem });
        stream.sub = sub;
        if (stream.closed) return sub.close();
        if (!res.headersSent) {
          res.writeHead(200, headers('text/event-stream; charset=utf-8', { connection: 'keep-alive' }));
          keepalive = setInterval(() => send(': keep-alive\n\n'), KEEPALIVE_MS);
          send(`event: relay\ndata: ${JSON.stringify({ app, gem: feedGem, actions: allowed })}\n\n`);
        }
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
      send(lostMessage(SERVICE, 'the subscription ended'));
    } catch (e) {
      const code = e?.code ?? SERVICE;
      if (code === SERVICE && !stream.closed) serviceLost(e);
      if (!res.headersSent) {
        close();
        return failFeed(res, 503, code, outage?.message ?? String(e?.message ?? e));
      }
      send(lostMessage(code, String(e?.message ?? e)));
    }
    close();
  }

  return {
    url: `http://127.0.0.1:${bound}/`,
    pageUrl: pageUrlOf(list?.[0], token),
    port: bound,
    token,
    server,
    /** A new link to the page of `gem` (default: the first), whose token is good once. */
    newPageUrl(gemId = list?.[0]) {
      return pageUrlOf(gemId, mint());
    },
    /** The outage the relay is in (`{code, message, since}`), or null. */
    get outage() {
      return outage;
    },
    async close() {
      if (emitter) {
        const off = (source.off ?? source.removeListener).bind(source);
        off('disconnected', onDisconnected);
        off('reconnected', onReconnected);
      }
      clearInterval(probeTimer);
      for (const stream of [...streams]) {
        stream.res.destroy();
      }
      server.closeAllConnections?.();
      await new Promise((resolve) => server.close(() => resolve()));
    },
  };
}

function usage() {
  return [
    'usage: node relay.js --store DIR [--gem GEM]... [--app-name NAME] [--port N] [--actions]',
    '  serves the gem page of each GEM (without --gem: of any installed gem) on 127.0.0.1,',
    '  fed by the service of the store DIR; NAME is the app the page names when the service is away;',
    '  --actions lets the page retry, download now and cancel (else it only watches)',
  ].join('\n');
}

async function main(argv) {
  const args = { gem: [] };
  for (let i = 0; i < argv.length; i++) {
    const a = argv[i];
    if (a === '--help' || a === '-h') {
      console.log(usage());
      return;
    }
    if (a === '--actions') {
      args.actions = true;
      continue;
    }
    if (!['--store', '--gem', '--port', '--app-name'].includes(a) || argv[i + 1] === undefined) {
      console.error(usage());
      process.exitCode = 2;
      return;
    }
    const value = argv[++i];
    if (a === '--gem') args.gem.push(value);
    else args[a.slice(2)] = value;
  }
  if (!args.store) {
    console.error(usage());
    process.exitCode = 2;
    return;
  }
  const appName = args['app-name'];
  const { connect } = await import('../index.js');
  const client = await connect({ store: args.store, ...(appName ? { appName } : {}) });
  const relay = await startRelay({ source: client, gems: args.gem.length > 0 ? args.gem : undefined, appName, actions: Boolean(args.actions), port: Number(args.port ?? 0) });
  const links = async () => {
    let gems = args.gem;
    if (gems.length === 0) {
      const status = await client.status().catch(() => ({ gems: [] }));
      gems = status.gems.map((g) => g.gem);
    }
    if (gems.length === 0) console.log('no gem is installed yet: press Enter for links once one is');
    for (const g of gems) console.log(`gem page of ${g}: ${relay.newPageUrl(g)}`);
    console.log('each link opens once (then a cookie of the browser lets it in); press Enter for new links');
  };
  await links();
  if (process.stdin.isTTY) process.stdin.on('data', () => links());
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
