// <gem-resources-page gem="notes">: the gem page's list of files, drawn
// from the model (../model.js). A plain ES module custom element, no
// framework, no build step.
//
//   <script type="module" src="…/page/gem-resources-page.js"></script>
//   <gem-resources-page gem="notes" relay="http://127.0.0.1:PORT/TOKEN/"></gem-resources-page>
//
// or, fed by anything with the client's `status(gem)` / `subscribe({gem})`
// shapes (an Electron preload's bridge, the Node client in a test):
//
//   document.querySelector('gem-resources-page').source = window.gemResources;
//
// Each file is a row of a <table> (description, size, host, when it
// downloads, state); a downloading file has a <progress>; every state is
// written out in words (colour only repeats it). When the element is
// narrower than 600 px the cells stack, so the page reads at 320 px.

import { ETA_AFTER_MS, afterFailure, etaHeld, formatBytes, stateText, timeOfDay, watchGem } from '../model.js';

/** How long a download shows `--` for its time left after it starts or resumes (ms): the model's rule. */
export { ETA_AFTER_MS };

/** The actions a row can offer, in the source's words (the client's method names). */
export const ACTIONS = ['retry', 'downloadNow', 'cancel'];

/** The relay's path of each action. */
const ACTION_PATHS = { retry: 'retry', downloadNow: 'download-now', cancel: 'cancel' };

/** The `source` of the relay (relay.js) at `base` (its URL, e.g. `http://127.0.0.1:PORT/`; relative to the page). */
export class RelaySource {
  constructor(base) {
    const url = new URL(base, globalThis.document?.baseURI);
    if (!url.pathname.endsWith('/')) url.pathname += '/';
    this.base = url;
    /** The app's name, as the relay gives it (null until it did, or when it has none). */
    this.appName = null;
    /** The actions the relay allows (its `actions` option): none until it said. */
    this.actions = [];
  }

  /** Asks the relay for `action` (one of ACTIONS) on `gem`'s `id`; the relay refuses unless the app enabled it. */
  async act(action, gem, id) {
    const url = new URL(`act/${encodeURIComponent(gem)}/${encodeURIComponent(id)}/${ACTION_PATHS[action]}`, this.base);
    let response;
    try {
      response = await fetch(url, { method: 'POST', cache: 'no-store', credentials: 'same-origin' });
    } catch (e) {
      throw relayError(`the relay at ${this.base.origin} did not answer (${e?.message ?? e})`);
    }
    let body = null;
    try {
      body = JSON.parse(await response.text());
    } catch {
      // not the relay's JSON
    }
    if (!response.ok) throw relayError(body?.message ?? `the relay answered ${response.status}`, body?.code, response.status);
    return body;
  }

  retry(gem, id) {
    return this.act('retry', gem, id);
  }

  downloadNow(gem, id) {
    return this.act('downloadNow', gem, id);
  }

  cancel(gem, id) {
    return this.act('cancel', gem, id);
  }

  feed(gem, what) {
    return new URL(`feed/${encodeURIComponent(gem)}/${what}`, this.base);
  }

  /** A fetch of the relay: its response, or an E_RESOURCE_SERVICE error saying why not (the relay's own reason for a refusal). */
  async fetch(url, signal) {
    let response;
    try {
      response = await fetch(url, { cache: 'no-store', credentials: 'same-origin', signal });
    } catch (e) {
      throw relayError(`the relay at ${this.base.origin} did not answer (${e?.message ?? e})`);
    }
    if (response.ok) return response;
    let reason = null;
    try {
      reason = JSON.parse(await response.text());
    } catch {
      // not the relay's JSON
    }
    if (reason && typeof reason.app === 'string') this.appName = reason.app;
    throw relayError(reason?.message ?? `the relay answered ${response.status}`, reason?.code, response.status);
  }

  /** `{gems: [GemStatus]}` of `gem`. */
  async status(gem) {
    return (await this.fetch(this.feed(gem, 'status'))).json();
  }

  /**
   * A subscription like the client's: resolves once the relay sent the
   * status (`status`), then yields the events; a status sent again (the
   * relay subscribed again after `lagged`) comes as `{event: 'resubscribed'}`.
   * Rejects, or throws, E_RESOURCE_SERVICE with the relay's reason when the
   * feed is refused (the service is away: 503) or lost.
   */
  async subscribe({ gem }) {
    const controller = new AbortController();
    const response = await this.fetch(this.feed(gem, 'events'), controller.signal);
    return new Promise((resolve, reject) => {
      const queue = [];
      const waiters = [];
      let done = false;
      let failure = null;
      let subscription = null;
      const push = (item) => {
        if (done) return;
        const waiter = waiters.shift();
        if (waiter) waiter.resolve({ value: item, done: false });
        else queue.push(item);
      };
      const end = (error) => {
        if (done) return;
        done = true;
        failure = error;
        controller.abort();
        if (!subscription) reject(error ?? relayError('the feed closed'));
        while (waiters.length > 0) {
          const waiter = waiters.shift();
          if (error) waiter.reject(error);
          else waiter.resolve({ value: undefined, done: true });
        }
      };
      const onMessage = (event, data) => {
        if (event === 'relay') {
          this.appName = typeof data.app === 'string' ? data.app : null;
          this.actions = Array.isArray(data.actions) ? data.actions.filter((a) => ACTIONS.includes(a)) : [];
        } else if (event === 'status') {
          if (!subscription) {
            subscription = {
              status: data,
              next() {
                if (queue.length > 0) return Promise.resolve({ value: queue.shift(), done: false });
                if (done) return failure ? Promise.reject(failure) : Promise.resolve({ value: undefined, done: true });
                return new Promise((res, rej) => waiters.push({ resolve: res, reject: rej }));
              },
              return() {
                end(null);
                return Promise.resolve({ value: undefined, done: true });
              },
              close() {
                end(null);
              },
              [Symbol.asyncIterator]() {
                return this;
              },
            };
            resolve(subscription);
          } else {
            push({ event: 'resubscribed', at: new Date().toISOString(), reason: 'the relay subscribed again', status: data });
          }
        } else if (event === 'lost') {
          if (typeof data.app === 'string') this.appName = data.app;
          end(relayError(data.message ?? 'the relay lost the service', data.code));
        } else {
          push(data);
        }
      };
      // Server-Sent Events read by hand (not EventSource, which would
      // reconnect by itself and miss events meanwhile, and cannot read why
      // a feed was refused): watchGem subscribes again and redraws.
      (async () => {
        const reader = response.body.pipeThrough(new TextDecoderStream()).getReader();
        let buffer = '';
        for (;;) {
          const { value, done: over } = await reader.read();
          if (over) break;
          buffer += value.replace(/\r\n?/g, '\n');
          let cut;
          while ((cut = buffer.indexOf('\n\n')) >= 0) {
            const block = buffer.slice(0, cut);
            buffer = buffer.slice(cut + 2);
            let event = 'message';
            const data = [];
            for (const line of block.split('\n')) {
              if (line.startsWith(':')) continue;
              const colon = line.indexOf(':');
              const field = colon < 0 ? line : line.slice(0, colon);
              const text = colon < 0 ? '' : line.slice(colon + 1).replace(/^ /, '');
              if (field === 'event') event = text;
              else if (field === 'data') data.push(text);
            }
            if (data.length > 0) onMessage(event, JSON.parse(data.join('\n')));
          }
        }
        end(relayError('the relay closed the feed'));
      })().catch((e) => end(done ? null : relayError(`the feed from the relay was lost (${e?.message ?? e})`)));
    });
  }
}

function relayError(message, code = 'E_RESOURCE_SERVICE', status) {
  return Object.assign(new Error(message), { code, ...(status ? { status } : {}) });
}

const CSS = `
:host {
  display: block;
  container-type: inline-size;
  --grp-fg: CanvasText;
  --grp-muted: color-mix(in srgb, CanvasText 62%, Canvas);
  --grp-line: color-mix(in srgb, CanvasText 18%, Canvas);
  --grp-ok: #1a7f37;
  --grp-busy: #0969da;
  --grp-bad: #cf222e;
  --grp-idle: #6e7781;
  color: var(--grp-fg);
  font: inherit;
  line-height: 1.4;
}
@media (prefers-color-scheme: dark) {
  :host { --grp-ok: #3fb950; --grp-busy: #58a6ff; --grp-bad: #f85149; --grp-idle: #8b949e; }
}
h2 { font-size: 1.15em; margin: 0 0 .25em; }
.summary, .notice p { margin: 0 0 .5em; color: var(--grp-muted); }
.notice:empty, .notice > :empty { display: none; }
.outage { margin: 0 0 .75em; padding: .5em .75em; border: 1px solid var(--grp-bad); border-inline-start-width: 4px; border-radius: 6px; }
.outage p { margin: 0; color: var(--grp-fg); }
.outage strong { color: var(--grp-bad); }
.outage details { margin-top: .35em; font-size: .85em; color: var(--grp-muted); }
.outage summary { cursor: pointer; }
.outage details p { margin: .25em 0 0; color: var(--grp-muted); overflow-wrap: anywhere; }
.sr { position: absolute; width: 1px; height: 1px; margin: -1px; padding: 0; overflow: hidden; clip: rect(0 0 0 0); white-space: nowrap; border: 0; }
table { width: 100%; border-collapse: collapse; }
caption { text-align: start; }
th, td { text-align: start; vertical-align: top; padding: .45em .6em; border-bottom: 1px solid var(--grp-line); }
thead th { font-size: .85em; font-weight: 600; color: var(--grp-muted); border-bottom-width: 2px; }
tbody th { font-weight: 600; }
.file { display: block; font-weight: normal; font-size: .85em; color: var(--grp-muted); overflow-wrap: anywhere; }
.num { white-space: nowrap; font-variant-numeric: tabular-nums; }
td.when { white-space: nowrap; }
.mirrors { display: block; font-size: .85em; color: var(--grp-muted); overflow-wrap: anywhere; }
td.state { min-width: 14em; }
td.state .text { display: block; overflow-wrap: anywhere; }
td.state .headline { font-weight: 600; }
td.state details.hashes { font-size: .8em; color: var(--grp-muted); }
td.state details.hashes code { display: block; overflow-wrap: anywhere; }
td.state .codes { display: block; font-size: .8em; color: var(--grp-muted); overflow-wrap: anywhere; }
td.state .mark { font-weight: 700; margin-inline-end: .3em; }
tr[data-state="present"] .mark, tr[data-state="present"] .headline { color: var(--grp-ok); }
tr[data-state="downloading"] .mark { color: var(--grp-busy); }
tr[data-state="failed"] .mark, tr[data-state="failed"] .headline { color: var(--grp-bad); }
tr[data-state="failed"] td.state { border-inline-start: 3px solid var(--grp-bad); }
tr[data-state="present"] td.state { border-inline-start: 3px solid var(--grp-ok); }
tr[data-state="downloading"] td.state { border-inline-start: 3px solid var(--grp-busy); }
tr[data-state="queued"] .mark, tr[data-state="missing"] .mark, tr[data-state="waiting"] .mark { color: var(--grp-idle); }
td.state .after { display: block; }
td.state .actions { display: flex; flex-wrap: wrap; gap: .4em; margin-top: .3em; }
td.state .actions:empty { display: none; }
td.state .actions button { font: inherit; font-size: .85em; padding: .15em .7em; border-radius: 6px; border: 1px solid var(--grp-line); background: Canvas; color: var(--grp-fg); cursor: pointer; }
td.state .actions button[data-action="retry"], td.state .actions button[data-action="downloadNow"] { border-color: var(--grp-busy); color: var(--grp-busy); }
td.state .actions button:disabled { opacity: .6; cursor: progress; }
td.state .action-error { display: block; font-size: .85em; color: var(--grp-bad); }
progress { display: block; width: 100%; height: .8em; margin: .15em 0 .25em; accent-color: var(--grp-busy); }
.empty td { color: var(--grp-muted); }
@container (max-width: 600px) {
  table, tbody, tr, th, td { display: block; }
  thead { position: absolute; width: 1px; height: 1px; overflow: hidden; clip: rect(0 0 0 0); }
  tbody tr { border: 1px solid var(--grp-line); border-radius: 6px; margin: 0 0 .75em; padding: .25em 0; }
  th, td { border: 0; padding: .2em .7em; }
  td.state { min-width: 0; }
  td.when { white-space: normal; }
  tr[data-state] td.state { border-inline-start: 0; }
  td[data-label]::before { content: attr(data-label) ": "; font-weight: 600; color: var(--grp-muted); }
  td.state[data-label]::before { display: block; }
}
`;

/** A short word per state, the start of each state cell (the rest is the model's text). */
const MARKS = {
  present: '✓',
  downloading: '↓',
  queued: '…',
  waiting: '…',
  failed: '✕',
  missing: '○',
};

const COLUMNS = [
  ['file', 'File'],
  ['size', 'Size'],
  ['host', 'Host'],
  ['when', 'Downloads'],
  ['state', 'State'],
];

function el(tag, attrs = {}, ...children) {
  const node = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs)) {
    if (v === null || v === undefined || v === false) continue;
    if (k === 'class') node.className = v;
    else node.setAttribute(k, v === true ? '' : String(v));
  }
  for (const c of children) if (c !== null && c !== undefined) node.append(c);
  return node;
}

export class GemResourcesPage extends HTMLElement {
  static get observedAttributes() {
    return ['gem', 'relay', 'app-name', 'actions'];
  }

  constructor() {
    super();
    this._source = null;
    this._watch = null;
    this._drawn = new Map(); // id → {tr, row}
    this._actionErrors = new Map(); // id → what the last action said
    this._pending = false;
    const root = this.attachShadow({ mode: 'open' });
    if (root.adoptedStyleSheets !== undefined && typeof CSSStyleSheet === 'function' && 'replaceSync' in CSSStyleSheet.prototype) {
      const sheet = new CSSStyleSheet();
      sheet.replaceSync(CSS);
      root.adoptedStyleSheets = [sheet];
    } else {
      root.append(el('style', {}, CSS));
    }
    this._heading = el('h2', { id: 'heading' });
    this._summary = el('p', { class: 'summary' });
    this._outage = el('div', { class: 'outage', role: 'status' });
    this._policy = el('p', { class: 'policy' });
    this._notice = el('div', { class: 'notice' }, this._outage, this._policy);
    this._live = el('div', { class: 'sr', 'aria-live': 'polite' });
    this._tbody = el('tbody', { role: 'rowgroup' });
    const head = el('tr', { role: 'row' }, ...COLUMNS.map(([, name]) => el('th', { scope: 'col', role: 'columnheader' }, name)));
    this._table = el(
      'table',
      { role: 'table', 'aria-labelledby': 'heading', 'aria-describedby': 'summary' },
      el('caption', { class: 'sr' }, 'Each file: its description, size, the host it comes from, when it downloads, and its state'),
      el('thead', { role: 'rowgroup' }, head),
      this._tbody,
    );
    this._summary.id = 'summary';
    root.append(el('section', { 'aria-labelledby': 'heading' }, this._heading, this._summary, this._notice, this._table, this._live));
  }

  /** Anything with `status(gem)` and `subscribe({gem})` (the client, a preload's bridge, a RelaySource). Wins over `relay`. */
  get source() {
    return this._source;
  }

  set source(value) {
    this._source = value ?? null;
    if (this.isConnected) this._startSoon();
  }

  /** The model drawn (GemPageModel), once a feed runs. */
  get model() {
    return this._watch?.model ?? null;
  }

  connectedCallback() {
    this._startSoon();
  }

  disconnectedCallback() {
    if (!this.isConnected) this._stop();
  }

  attributeChangedCallback(_name, old, value) {
    if (old !== value && this.isConnected) this._startSoon();
  }

  /** One start for the attributes set together (an upgrade calls attributeChangedCallback per attribute, then connectedCallback). */
  _startSoon() {
    if (this._starting) return;
    this._starting = true;
    queueMicrotask(() => {
      this._starting = false;
      if (this.isConnected) this._start();
    });
  }

  _stop() {
    if (this._watch) this._watch.stop();
    this._watch = null;
  }

  _start() {
    this._stop();
    const gem = this.getAttribute('gem');
    const relay = this.getAttribute('relay');
    const source = this._source ?? (relay ? new RelaySource(relay) : null);
    this._activeSource = source;
    this._heading.textContent = gem ? `Files of ${gem}` : 'Files';
    if (!gem || !source) {
      this._clear();
      this._summary.textContent = '';
      this._outage.replaceChildren();
      this._policy.textContent = !gem ? 'No gem given (the gem attribute).' : 'No feed: set the source property or the relay attribute.';
      return;
    }
    this._clear();
    this._watch = watchGem(this._peeking(source, gem), gem, () => this._schedule());
    this._draw();
  }

  /**
   * `source` as watchGem sees it, the gem's `name` taken from each status
   * that has one on the way (the heading says it rather than the id).
   */
  _peeking(source, gem) {
    const note = (status) => {
      const list = Array.isArray(status) ? status : (status?.gems ?? (status ? [status] : []));
      const name = list.find((g) => g && g.gem === gem)?.name;
      if (typeof name === 'string' && name.trim() !== '') setText(this._heading, `Files of ${name}`);
      return status;
    };
    const peeking = Object.create(source);
    peeking.status = (g) => Promise.resolve(source.status(g)).then(note);
    peeking.subscribe = async (options) => {
      const sub = await source.subscribe(options);
      note(sub?.status);
      return sub;
    };
    if (typeof source.on === 'function') peeking.on = source.on.bind(source);
    if (typeof source.off === 'function') peeking.off = source.off.bind(source);
    if (typeof source.removeListener === 'function') peeking.removeListener = source.removeListener.bind(source);
    return peeking;
  }

  _clear() {
    this._drawn.clear();
    this._tbody.replaceChildren();
  }

  _schedule() {
    if (this._pending) return;
    this._pending = true;
    const run = () => {
      this._pending = false;
      this._draw();
    };
    if (typeof requestAnimationFrame === 'function' && document.visibilityState === 'visible') requestAnimationFrame(run);
    else setTimeout(run, 50);
  }

  _draw() {
    const model = this.model;
    if (!model) return;
    this._drawNotice(model);
    const rows = model.rows;
    const seen = new Set();
    const announce = [];
    let held = false;
    rows.forEach((row, index) => {
      seen.add(row.id);
      let drawn = this._drawn.get(row.id);
      if (!drawn) {
        drawn = { tr: this._newRow(row), row: null, model: null };
        this._drawn.set(row.id, drawn);
      }
      if (drawn.model !== row || drawn.held) {
        // A download's time left reads `--` for its first seconds after a
        // start or a resume (the model's rule): redrawn until it shows.
        drawn.model = row;
        drawn.held = etaHeld(row);
        const shown = row.state === 'downloading' ? { ...row, text: stateText(row) } : row;
        if (drawn.held) held = true;
        if (drawn.row && drawn.row.state !== shown.state) {
          const text = shown.state === 'failed' && shown.error ? `Failed: ${headlineOf(shown.error)}` : shown.text;
          announce.push(`${shown.description ?? shown.label}: ${text}`);
        }
        this._fill(drawn.tr, shown, drawn.row);
        drawn.row = shown;
      }
      this._fillActions(drawn.tr.querySelector('td.state'), row);
      if (this._tbody.children[index] !== drawn.tr) this._tbody.insertBefore(drawn.tr, this._tbody.children[index] ?? null);
    });
    for (const [id, drawn] of this._drawn) {
      if (!seen.has(id)) {
        drawn.tr.remove();
        this._drawn.delete(id);
      }
    }
    const empty = this._tbody.querySelector('tr.empty');
    if (rows.length === 0) {
      const c = model.connection;
      const text =
        model.installed === false
          ? 'This gem is not installed: it has no files.'
          : c.error && model.installed === null
            ? `The files show once ${this.appName ?? 'the service'} is back.`
            : 'Loading…';
      if (!empty) {
        this._tbody.append(el('tr', { class: 'empty', role: 'row' }, el('td', { colspan: COLUMNS.length, role: 'cell' }, text)));
      } else {
        setText(empty.firstChild, text);
      }
    } else if (empty) {
      empty.remove();
    }
    this._summary.textContent = summaryOf(model);
    // A time left held back shows without waiting for the next event.
    if (held && !this._heldTimer) {
      this._heldTimer = setTimeout(() => {
        this._heldTimer = null;
        this._schedule();
      }, 1000);
    }
    if (announce.length > 0) this._live.textContent = announce.join('. ');
  }

  /** The app's name: the `app-name` attribute, else the one the source gives (the relay's `appName`), else null. */
  get appName() {
    return this.getAttribute('app-name') || this._activeSource?.appName || null;
  }

  _drawNotice(model) {
    const c = model.connection;
    const lost = c.state === 'lost' || (c.state === 'connecting' && c.error);
    this._notice.dataset.kind = lost ? 'lost' : '';
    if (lost) {
      // In words for the app's user; what a developer needs, folded away.
      const app = this.appName;
      const headline = app ? `Lost contact with ${app}` : 'Lost contact with the download service';
      const text = `: the rows may be out of date. This page updates by itself once ${app ? `${app} is` : 'it is'} back.`;
      const key = `${headline}${text}|${c.error?.message}|${c.error?.code}`;
      if (this._outage.dataset.key !== key) {
        this._outage.dataset.key = key;
        const since = this._outageSince ?? (this._outageSince = new Date());
        this._outage.replaceChildren(
          el('p', {}, el('strong', {}, headline), text),
          el(
            'details',
            {},
            el('summary', {}, 'Details'),
            el('p', { class: 'reason' }, c.error?.message ?? 'no reason given'),
            el('p', { class: 'code' }, `Code: ${c.error?.code ?? 'E_RESOURCE_SERVICE'}. Since ${timeOfDay(since, { seconds: true })}.`),
          ),
        );
      }
    } else if (this._outage.firstChild) {
      this._outageSince = null;
      delete this._outage.dataset.key;
      this._outage.replaceChildren();
    }
    let text = c.state === 'connecting' && !c.error ? 'Connecting to the service…' : '';
    if (model.policy) {
      const at = model.policy.at ? ` at ${timeOfDay(model.policy.at, { seconds: true })}` : '';
      const n = model.policy.hosts;
      const list = model.policy.mode === 'allowlist' ? `only ${n} permitted host pattern${n === 1 ? '' : 's'}` : `${n} blocked host pattern${n === 1 ? '' : 's'}`;
      text = `${text} The network policy changed${at}: ${model.policy.mode}, ${list}.`.trim();
    }
    if (this._policy.textContent !== text) this._policy.textContent = text;
  }

  _newRow(row) {
    const tr = el('tr', { role: 'row', 'data-id': row.id });
    const title = el('span', { class: 'title' });
    const file = el('span', { class: 'file' });
    tr.append(
      el('th', { scope: 'row', role: 'rowheader' }, title, ' ', file),
      el('td', { role: 'cell', class: 'num size', 'data-label': 'Size' }),
      el('td', { role: 'cell', class: 'host', 'data-label': 'Host' }),
      el('td', { role: 'cell', class: 'when', 'data-label': 'Downloads' }),
      el('td', { role: 'cell', class: 'state', 'data-label': 'State' }),
    );
    return tr;
  }

  _fill(tr, row, before) {
    tr.dataset.state = row.state;
    tr.dataset.blocked = String(row.blocked);
    const [th, size, host, when, state] = tr.children;
    if (!before || before.description !== row.description || before.label !== row.label || before.file !== row.file) {
      th.querySelector('.title').textContent = row.description ?? row.label;
      th.querySelector('.file').textContent = row.file && row.file !== (row.description ?? row.label) ? row.file : '';
    }
    setText(size, row.size === null ? 'unknown' : formatBytes(row.size));
    if (!before || before.host !== row.host || before.hosts.join() !== row.hosts.join()) {
      const others = row.hosts.filter((h) => h !== row.host);
      host.replaceChildren(row.host ?? 'unknown');
      if (others.length > 0) host.append(' ', el('span', { class: 'mirrors' }, `mirror${others.length === 1 ? '' : 's'}: ${others.join(', ')}`));
    }
    setText(when, row.required ? 'Right after install' : 'Only when used');
    this._fillState(state, row, before);
  }

  _fillState(cell, row, before) {
    const label = row.description ?? row.label;
    let progress = cell.querySelector('progress');
    const showBar = row.state === 'downloading' || (row.state === 'waiting' && typeof row.bytes === 'number');
    if (showBar) {
      if (!progress) {
        progress = el('progress', { 'aria-label': `${label}: download progress` });
        cell.prepend(progress);
      }
      if (typeof row.bytes === 'number' && row.size) {
        progress.max = row.size;
        progress.value = row.bytes;
      } else {
        progress.removeAttribute('value'); // indeterminate
      }
    } else if (progress) {
      progress.remove();
    }
    let body = cell.querySelector('.body');
    if (!body) {
      body = el('span', { class: 'body' });
      cell.append(body);
    }
    if (before && before.text === row.text && before.state === row.state && afterFailure(before) === afterFailure(row)) return;
    const mark = el('span', { class: 'mark', 'aria-hidden': 'true' }, MARKS[row.state] ?? '');
    if (row.state === 'failed' && row.error) {
      const codes = row.error.code !== row.error.primaryCause ? `${row.error.code}, caused by ${row.error.primaryCause}` : row.error.primaryCause;
      const hashes = [...new Set(String(row.error.detail ?? '').match(HASH) ?? [])];
      const detail = String(row.error.detail ?? '').replace(HASH, (h) => `${h.slice(0, 12)}…`);
      body.replaceChildren(
        el('span', { class: 'text' }, mark, el('span', { class: 'headline' }, `Failed: ${headlineOf(row.error)}`), detail ? ` — ${detail}.` : '.'),
        ' ',
        ...(afterFailure(row) ? [el('span', { class: 'after' }, `${capital(afterFailure(row))}.`), ' '] : []),
        ...(hashes.length > 0 ? [el('details', { class: 'hashes' }, el('summary', {}, 'Full SHA-256'), ...hashes.map((h) => el('code', {}, h)))] : []),
        el('span', { class: 'codes' }, `Code: ${codes}`),
      );
    } else {
      body.replaceChildren(el('span', { class: 'text' }, mark, row.text));
    }
  }
  /**
   * Whether the element offers `action` (one of ACTIONS): `actions="none"`
   * offers none; `actions="event"` offers each and only dispatches its
   * event (the app acts); else what the source allows: its `actions` list
   * when it has one (a relay says which it allows, none unless the app
   * enabled them), else the methods it has (the client's `retry(gem, id)`,
   * `downloadNow(gem, id)`, `cancel(gem, id)`).
   */
  allows(action) {
    const mode = this.getAttribute('actions');
    if (mode === 'none') return false;
    if (mode === 'event') return true;
    const source = this._activeSource;
    if (!source) return false;
    if (Array.isArray(source.actions)) return source.actions.includes(action) && typeof source[action] === 'function';
    return typeof source[action] === 'function';
  }

  _fillActions(cell, row) {
    if (!cell) return;
    let box = cell.querySelector('.actions');
    if (!box) {
      box = el('span', { class: 'actions' });
      cell.append(box);
    }
    const offered = actionsOf(row).filter(([action]) => this.allows(action));
    const error = this._actionErrors.get(row.id) ?? '';
    const key = `${row.state}|${offered.map(([a]) => a).join()}|${error}`;
    if (box.dataset.key === key) return;
    box.dataset.key = key;
    const label = row.description ?? row.label;
    box.replaceChildren(
      ...offered.map(([action, text]) => {
        const button = el('button', { type: 'button', 'data-action': action, 'aria-label': `${text}: ${label}` }, text);
        button.addEventListener('click', () => this._act(action, row.id, button));
        return button;
      }),
    );
    let said = cell.querySelector('.action-error');
    if (error) {
      if (!said) {
        said = el('span', { class: 'action-error', role: 'alert' });
        cell.append(said);
      }
      setText(said, error);
    } else if (said) {
      said.remove();
    }
  }

  /**
   * A button was pressed: a cancelable, bubbling `gem-resources-action`
   * event ({gem, resource, action}) first; unless the app called
   * preventDefault() (it acts itself), the source's method is called.
   */
  async _act(action, id, button) {
    const gem = this.getAttribute('gem');
    const event = new CustomEvent('gem-resources-action', { detail: { gem, resource: id, action }, bubbles: true, composed: true, cancelable: true });
    if (!this.dispatchEvent(event)) return;
    const source = this._activeSource;
    if (this.getAttribute('actions') === 'event' || typeof source?.[action] !== 'function') return;
    button.disabled = true;
    this._actionErrors.delete(id);
    try {
      await source[action](gem, id);
    } catch (e) {
      const what = { retry: 'Retry', downloadNow: 'Download now', cancel: 'Cancel' }[action];
      this._actionErrors.set(id, `${what} did not go through: ${e?.message ?? e}`);
    } finally {
      button.disabled = false;
      this._schedule();
    }
  }
}

/** What a row in `state` can be asked: [action, the button's words]. */
function actionsOf(row) {
  switch (row.state) {
    case 'failed':
      return [['retry', 'Retry']];
    case 'missing':
      return [['downloadNow', 'Download now']];
    case 'queued':
    case 'waiting':
    case 'downloading':
      return [['cancel', 'Cancel']];
    default:
      return [];
  }
}

function capital(text) {
  return text ? `${text[0].toUpperCase()}${text.slice(1)}` : text;
}

/** A SHA-256 in a message: shown by its first 12 digits, the whole in a <details>. */
const HASH = /\b[0-9a-f]{64}\b/g;

/** The headline of a failed row: the model's (an HTTP status in words: a 404 is not a 500). */
function headlineOf(error) {
  return error.headline;
}

function setText(node, text) {
  if (node.textContent !== text) node.textContent = text;
}

/** `2 of 3 files ready, 1 downloading, 1 blocked by the network policy`. */
function summaryOf(model) {
  if (model.installed === null) return '';
  if (!model.installed) return 'Not installed.';
  const rows = model.rows;
  const count = (pred) => rows.filter(pred).length;
  const parts = [`${count((r) => r.state === 'present')} of ${rows.length} file${rows.length === 1 ? '' : 's'} ready`];
  const downloading = count((r) => r.state === 'downloading');
  if (downloading) parts.push(`${downloading} downloading`);
  const queued = count((r) => r.state === 'queued' || r.state === 'waiting');
  if (queued) parts.push(`${queued} waiting`);
  const blocked = count((r) => r.blocked);
  if (blocked) parts.push(`${blocked} blocked by the network policy`);
  const failed = count((r) => r.state === 'failed' && !r.blocked);
  if (failed) parts.push(`${failed} failed`);
  const total = rows.reduce((sum, r) => sum + (r.size ?? 0), 0);
  return `${parts.join(', ')} (${formatBytes(total)} in all).`;
}

if (typeof customElements !== 'undefined' && !customElements.get('gem-resources-page')) {
  customElements.define('gem-resources-page', GemResourcesPage);
}
