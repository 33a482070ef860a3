// The gem page's model: one gem's files as rows a page draws, kept true
// from a `status` and the subscription's events (PROTOCOL.md, "status",
// "subscribe", "Events"). Framework-free and without dependencies: the same
// file runs in Node, in an Electron preload and in a browser page.
//
//   const model = new GemPageModel('notes');
//   model.onChange((m) => draw(m.rows));
//   model.reset(subscription.status);      // or a `status` answer
//   for await (const event of subscription) model.apply(event);
//
// or, with anything that has the client's `subscribe({gem})` (and
// `status(gem)`) shapes, resubscribing after `lagged` and a lost connection:
//
//   const watch = watchGem(client, 'notes', (rows) => draw(rows));
//   …
//   watch.stop();
//
// Every number a row shows comes from the service: `rate` is the event's
// `bytes_per_sec`, `etaSecs` its `eta_secs`; the model never measures a
// rate of its own.

/** The code of a subscription that fell behind and was ended by the service. */
const LAGGED = 'E_RESOURCE_LAGGED';
/** The primary cause of a refusal by the network policy. */
const POLICY = 'E_RESOURCE_POLICY';

/** Events about one file of a gem: they name `gem`, `resource` and `sha256`. */
const FILE_EVENTS = new Set([
  'queued',
  'started',
  'resumed',
  'progress',
  'retrying',
  'fell_back',
  'waiting',
  'verified',
  'failed',
  'cancelled',
  'deleted',
]);

/** What each primary cause means, in a few words (the headline of a failed row). */
const CAUSES = {
  E_RESOURCE_POLICY: 'Blocked by the network policy',
  E_RESOURCE_NETWORK: 'Network error',
  E_RESOURCE_HTTP: 'The server refused the download',
  E_RESOURCE_REDIRECTS: 'Too many redirects',
  E_RESOURCE_ADDRESS: 'The address is not allowed',
  E_RESOURCE_SCHEME: 'The address is not https',
  E_RESOURCE_SIZE: 'The file had the wrong size',
  E_RESOURCE_SHA256: 'The file did not match its checksum',
  E_RESOURCE_DISK_SPACE: 'Not enough disk space',
  E_RESOURCE_IO: 'The file could not be written',
  E_RESOURCE_CANCELLED: 'Cancelled',
  E_RESOURCE_SHUTDOWN: 'The service shut down',
  E_RESOURCE_NOT_FOUND: 'Not found',
};

/**
 * How long a download's time left reads `--` after it starts or resumes
 * (ms): the first estimates of a rate are guesses (ollama and aria2c show
 * `--` until they have a rate, too).
 */
export const ETA_AFTER_MS = 5000;

/**
 * A time of day in words, as `tries again at 07:38` says it: `07:38` today
 * (local time, 24 hours), `tomorrow at 07:38`, else `on 2026-12-06 at 07:38`.
 */
export function formatClock(iso, now = new Date()) {
  const when = new Date(iso);
  if (Number.isNaN(when.getTime())) return '';
  const pad = (n) => String(n).padStart(2, '0');
  const clock = timeOfDay(when);
  const day = (d) => `${d.getFullYear()}-${pad(d.getMonth() + 1)}-${pad(d.getDate())}`;
  const tomorrow = new Date(now);
  tomorrow.setDate(tomorrow.getDate() + 1);
  if (day(when) === day(now)) return `at ${clock}`;
  if (day(when) === day(tomorrow)) return `tomorrow at ${clock}`;
  return `on ${day(when)} at ${clock}`;
}

/** `18:31:05`: a time of day as the page writes every one (local time, 24 hours), or '' for no time. */
export function timeOfDay(when, { seconds = false } = {}) {
  const d = when instanceof Date ? when : new Date(when);
  if (Number.isNaN(d.getTime())) return '';
  const pad = (n) => String(n).padStart(2, '0');
  return `${pad(d.getHours())}:${pad(d.getMinutes())}${seconds ? `:${pad(d.getSeconds())}` : ''}`;
}

/**
 * What a failed row keeps and when it is tried again, in words:
 * `34.0 MiB of 200.0 MiB kept; tries again at 07:38`, or '' for neither.
 */
export function afterFailure(row, now = new Date()) {
  const parts = [];
  if (row.partialBytes) parts.push(`${formatBytes(row.partialBytes)}${row.size ? ` of ${formatBytes(row.size)}` : ''} kept`);
  if (row.nextTry) {
    const when = formatClock(row.nextTry, now);
    if (when) parts.push(`tries again ${when}`);
  }
  return parts.join('; ');
}

/** `1.5 MiB`: binary units, one decimal, as the command line writes them. */
export function formatBytes(n) {
  if (typeof n !== 'number' || !Number.isFinite(n)) return '';
  const units = ['B', 'KiB', 'MiB', 'GiB', 'TiB'];
  let value = n;
  let unit = 0;
  while (value >= 1024 && unit + 1 < units.length) {
    value /= 1024;
    unit += 1;
  }
  return unit === 0 ? `${n} B` : `${value.toFixed(1)} ${units[unit]}`;
}

/** `256.0 KiB/s`. */
export function formatRate(bytesPerSec) {
  return typeof bytesPerSec === 'number' ? `${formatBytes(bytesPerSec)}/s` : '';
}

/** `45 s`, `3 min`, `1 h 5 min`. */
export function formatDuration(secs) {
  if (typeof secs !== 'number' || !Number.isFinite(secs) || secs < 0) return '';
  const s = Math.round(secs);
  if (s < 60) return `${s} s`;
  if (s < 3600) return `${Math.round(s / 60)} min`;
  const h = Math.floor(s / 3600);
  const m = Math.round((s % 3600) / 60);
  return m ? `${h} h ${m} min` : `${h} h`;
}

/** The headline of an HTTP refusal by its status: a 404 is not a 500. */
function httpHeadline(cause, text) {
  if (cause !== 'E_RESOURCE_HTTP') return null;
  const status = /HTTP status (\d{3})/.exec(text)?.[1];
  if (status === '404' || status === '410') return 'Not found on the server';
  if (status === '429') return 'The server is busy (too many requests)';
  if (status?.startsWith('5')) return 'The server had an error';
  return null;
}

/**
 * An error of a row (a `failed` event, or a failed status row) in words:
 * `{code, primaryCause, message, policy, headline, detail, text}`. `detail`
 * is the reason of each address (the message's lines, or `attempts`);
 * `policy` is true when the network policy refused it.
 */
export function describeError({ code, primary_cause: primaryCause, message, attempts } = {}) {
  const cause = primaryCause ?? code ?? 'E_RESOURCE_UNAVAILABLE';
  const policy = cause === POLICY;
  const reasons = [];
  if (Array.isArray(attempts) && attempts.length > 0) {
    for (const a of attempts) {
      if (!policy || a.code === POLICY) reasons.push(a.reason ?? a.code);
    }
  } else if (typeof message === 'string') {
    // `resource "a": every address failed\n  - CODE: address: reason`
    for (const line of message.split('\n').slice(1)) {
      const m = /^\s*-\s*(E_[A-Z0-9_]+):\s*(.*)$/.exec(line);
      if (!m || (policy && m[1] !== POLICY)) continue;
      const rest = m[2];
      const split = rest.indexOf(': ');
      reasons.push(split >= 0 && /^[a-z][a-z0-9+.-]*:\/\//i.test(rest) ? rest.slice(split + 2) : rest);
    }
  }
  const unique = [...new Set(reasons.filter(Boolean))];
  const firstLine = typeof message === 'string' ? message.split('\n')[0] : '';
  const detail = unique.length > 0 ? unique.join('; ') : firstLine;
  const headline = httpHeadline(cause, `${detail} ${message ?? ''}`) ?? CAUSES[cause] ?? 'The download failed';
  const codes = code && code !== cause ? `${code}, caused by ${cause}` : cause;
  const text = `${headline}${detail ? `: ${detail}` : ''} (${codes})`;
  return { code: code ?? cause, primaryCause: cause, message: message ?? '', policy, headline, detail, text };
}

/**
 * Whether a downloading row's time left still reads `--` at `now` (ms): it
 * started or resumed less than ETA_AFTER_MS ago (`since`). A download
 * already under way when the status was read is not held.
 */
export function etaHeld(row, now = Date.now()) {
  return row.state === 'downloading' && typeof row.since === 'number' && now - row.since < ETA_AFTER_MS;
}

/**
 * The state of a row in words: what a screen reader says and what the page
 * shows. A download's time left reads `--` until a rate is known and for
 * ETA_AFTER_MS after a start or resume (at `now`, ms).
 */
export function stateText(row, now = Date.now()) {
  const of = row.size ? ` of ${formatBytes(row.size)}` : '';
  switch (row.state) {
    case 'present':
      return 'Downloaded and verified';
    case 'queued':
      return 'Queued to download';
    case 'waiting': {
      const bytes = typeof row.bytes === 'number' && row.bytes > 0 ? ` (${formatBytes(row.bytes)}${of} so far)` : '';
      return row.on
        ? `Waiting: gem ${row.on} is downloading the same file${bytes}`
        : `Waiting for another download of the same file${bytes}`;
    }
    case 'downloading': {
      const parts = [];
      const bytes = row.bytes ?? 0;
      const percent = row.size ? ` (${Math.floor((bytes / row.size) * 100)}%)` : '';
      parts.push(`Downloading: ${formatBytes(bytes)}${of}${percent}`);
      if (row.retry) {
        const wait = row.retry.waitMs ? ` in ${formatDuration(row.retry.waitMs / 1000)}` : '';
        parts.push(`retrying (attempt ${row.retry.attempt} of ${row.retry.of})${wait}: ${row.retry.reason}`);
      } else if (row.rate === 0) {
        parts.push('stalled');
      } else {
        if (typeof row.rate === 'number') parts.push(`${formatRate(row.rate)}`);
        if (typeof row.etaSecs === 'number' && !etaHeld(row, now)) parts.push(`about ${formatDuration(row.etaSecs)} left`);
        else parts.push('time left: --');
      }
      if (row.fellBack) parts.push(`switched to ${hostOf(row.fellBack.to) || 'another address'} after: ${row.fellBack.reason}`);
      return parts.join(', ');
    }
    case 'failed': {
      const after = afterFailure(row);
      return `${row.error ? `Failed. ${row.error.text}` : 'Failed'}${after ? `. ${after[0].toUpperCase()}${after.slice(1)}` : ''}`;
    }
    case 'missing':
    default: {
      const kept = row.partialBytes ? `; ${formatBytes(row.partialBytes)}${of} kept for later` : '';
      const stopped = row.cancelled ? `Stopped (${row.cancelled.reason})${kept}. ` : '';
      const base = row.required ? 'Not downloaded yet' : 'Not downloaded: downloads when first used';
      return stopped ? `${stopped}${base}` : `${base}${kept}`;
    }
  }
}

/** The host of an address, without its port; '' for one that does not parse. */
function hostOf(address) {
  try {
    return new URL(address).hostname;
  } catch {
    return '';
  }
}

/** A row from a status row (`ResourceStatus`): every field the page shows. */
function rowFromStatus(r) {
  const row = {
    id: r.id,
    label: r.label ?? r.id,
    description: r.description ?? null,
    file: r.file ?? null,
    size: typeof r.size === 'number' ? r.size : null,
    // The status row's `host` has no port: never derive it from an address.
    host: r.host ?? null,
    hosts: Array.isArray(r.hosts) ? r.hosts.slice() : r.host ? [r.host] : [],
    required: Boolean(r.required),
    when: r.required ? 'install' : 'use',
    sha256: r.sha256 ?? null,
    state: r.state ?? 'missing',
    bytes: null,
    partialBytes: typeof r.partial_bytes === 'number' ? r.partial_bytes : null,
    rate: null,
    etaSecs: null,
    since: null,
    nextTry: typeof r.next_try === 'string' ? r.next_try : null,
    address: null,
    on: null,
    retry: null,
    fellBack: null,
    cancelled: null,
    error: null,
    path: r.path ?? null,
    servedBy: r.served_by ?? null,
    at: r.at ?? null,
  };
  switch (row.state) {
    case 'present':
      row.bytes = row.size;
      break;
    case 'downloading':
      row.bytes = typeof r.bytes === 'number' ? r.bytes : 0;
      row.rate = typeof r.bytes_per_sec === 'number' ? r.bytes_per_sec : null;
      row.etaSecs = typeof r.eta_secs === 'number' ? r.eta_secs : null;
      break;
    case 'retrying':
      // Between two tries: a download, with what its last try said.
      row.state = 'downloading';
      row.bytes = typeof r.bytes === 'number' ? r.bytes : 0;
      row.retry = Object.freeze({ attempt: r.attempt, of: r.of, waitMs: null, reason: r.reason ?? '', address: null });
      break;
    case 'waiting':
      row.bytes = typeof r.bytes === 'number' ? r.bytes : null;
      row.on = r.on ?? null;
      break;
    case 'failed':
      row.error = describeError(r);
      break;
    default:
      break;
  }
  return finish(row);
}

/** Sets the derived fields (`eager`, `fraction`, `blocked`, `text`) and freezes the row. */
function finish(row) {
  row.eager = row.required;
  row.fraction =
    (row.state === 'downloading' || row.state === 'waiting') && row.size && typeof row.bytes === 'number'
      ? Math.min(1, row.bytes / row.size)
      : row.state === 'present'
        ? 1
        : null;
  row.blocked = row.state === 'failed' && Boolean(row.error?.policy);
  row.text = stateText(row);
  return Object.freeze(row);
}

/** The `[GemStatus…]` of `gem` in whatever `status` shape: a `status` answer, a subscription's list, one GemStatus. */
function gemStatusOf(status, gem) {
  if (!status) return null;
  const list = Array.isArray(status) ? status : Array.isArray(status.gems) ? status.gems : [status];
  return list.find((g) => g && g.gem === gem) ?? null;
}

/**
 * One gem's rows, kept true from a status and the events that follow it.
 * `rows` is a new frozen array of frozen rows after every change (compare
 * rows by identity to redraw only what changed).
 */
export class GemPageModel {
  constructor(gem) {
    if (typeof gem !== 'string' || gem === '') throw new TypeError('GemPageModel needs a gem id');
    this.gem = gem;
    /** Whether the gem is installed: null until a status was given. */
    this.installed = null;
    /** The rows, in manifest order. */
    this.rows = Object.freeze([]);
    /** The last `policy_changed`: `{mode, hosts (how many patterns), oldMode, oldHosts, at}`, or null. */
    this.policy = null;
    /**
     * The feed: `{state: 'connecting' | 'live' | 'lost' | 'stopped', error?, lagged?, at}`;
     * `watchGem` keeps it, a caller feeding the model itself may call `setConnection`.
     */
    this.connection = { state: 'connecting', at: null };
    /** When the service observed the last event applied (its `at`), or null. */
    this.at = null;
    this.listeners = new Set();
  }

  /** The row of resource `id`, or undefined. */
  row(id) {
    return this.rows.find((r) => r.id === id);
  }

  /** Calls `cb(model)` after each change; returns a function that stops it. */
  onChange(cb) {
    this.listeners.add(cb);
    return () => this.listeners.delete(cb);
  }

  emit() {
    for (const cb of [...this.listeners]) {
      try {
        cb(this);
      } catch (e) {
        // One listener's error must not stop the others, nor the feed.
        setTimeout(() => {
          throw e;
        });
      }
    }
  }

  /**
   * Rebuilds every row from a status: a `status` answer (`{gems: […]}`), a
   * subscription's `status` (`[GemStatus…]`) or one `GemStatus`. A status
   * without this gem means it is not installed (no rows).
   */
  reset(status) {
    const gem = gemStatusOf(status, this.gem);
    this.installed = Boolean(gem);
    this.rows = Object.freeze(gem ? gem.resources.map(rowFromStatus) : []);
    this.emit();
  }

  /** Sets the feed's state (`watchGem` does); emits a change. */
  setConnection(state, fields = {}) {
    this.connection = Object.freeze({ state, ...fields, at: new Date().toISOString() });
    this.emit();
  }

  /**
   * Applies one event (the `params` of an `event` notification, or the
   * client's `{event: 'resubscribed', status}`). Returns whether anything
   * changed (listeners are called then).
   */
  apply(event) {
    if (!event || typeof event.event !== 'string') return false;
    const kind = event.event;
    if (kind === 'resubscribed') {
      // The service restarted (or a relay resubscribed): draw from its status.
      if (event.at) this.at = event.at;
      if (this.connection.state === 'lost' || this.connection.state === 'connecting') {
        this.connection = Object.freeze({ state: 'live', at: new Date().toISOString() });
      }
      this.reset(event.status ?? []);
      return true;
    }
    if (kind === 'policy_changed') {
      this.at = event.at ?? this.at;
      this.policy = Object.freeze({
        mode: event.new_mode,
        hosts: event.new_hosts,
        oldMode: event.old_mode,
        oldHosts: event.old_hosts,
        at: event.at ?? null,
      });
      // Stopped downloads come as `failed`, files queued again as `queued`.
      this.emit();
      return true;
    }
    if (kind === 'deleted' && (event.gem === null || event.gem === undefined)) {
      return this.update((row) => row.sha256 === event.sha256, (row) => deletedRow(row, event));
    }
    if (event.gem !== this.gem) return false;
    if (kind === 'installed') {
      this.at = event.at ?? this.at;
      this.installed = true;
      this.rows = Object.freeze((event.resources ?? []).map(rowFromStatus));
      this.emit();
      return true;
    }
    if (kind === 'uninstalled') {
      this.at = event.at ?? this.at;
      this.installed = false;
      this.rows = Object.freeze([]);
      this.emit();
      return true;
    }
    if (!FILE_EVENTS.has(kind)) return false;
    // An event of another version of the file (before an upgrade) is not this row's.
    const matches = (row) => row.id === event.resource && (!event.sha256 || !row.sha256 || row.sha256 === event.sha256);
    return this.update(matches, (row) => nextRow(row, event));
  }

  /** Replaces each row `pick` selects with `change(row)` (null: unchanged). */
  update(pick, change) {
    let changed = false;
    const rows = this.rows.map((row) => {
      if (!pick(row)) return row;
      const next = change(row);
      if (!next) return row;
      changed = true;
      return next;
    });
    if (!changed) return false;
    this.rows = Object.freeze(rows);
    this.emit();
    return true;
  }
}

/** The row after a `deleted` of its file. */
function deletedRow(row, event) {
  return finish({
    ...row,
    state: 'missing',
    bytes: null,
    partialBytes: null,
    rate: null,
    etaSecs: null,
    path: null,
    servedBy: null,
    error: null,
    retry: null,
    fellBack: null,
    cancelled: null,
    at: event.at ?? row.at,
  });
}

/** The row after one of its file's events. */
function nextRow(row, e) {
  const at = e.at ?? row.at;
  const size = typeof e.size === 'number' ? e.size : row.size;
  const live = { size, at, error: null, cancelled: null, path: null, servedBy: null, nextTry: null };
  // When the download started or resumed here (a progress of a row that was
  // not downloading, or whose bytes went down, is a start): its time left
  // reads `--` for ETA_AFTER_MS.
  const since = (bytes) => (row.state === 'downloading' && (bytes ?? 0) >= (row.bytes ?? 0) ? row.since : Date.now());
  switch (e.event) {
    case 'queued':
      return finish({ ...row, ...live, state: 'queued', bytes: null, rate: null, etaSecs: null, retry: null, fellBack: null, on: null, address: null });
    case 'started':
      return finish({ ...row, ...live, state: 'downloading', since: row.state === 'downloading' ? row.since : Date.now(), bytes: row.state === 'downloading' ? row.bytes : 0, rate: null, etaSecs: null, retry: null, on: null, address: e.address ?? null });
    case 'resumed':
      return finish({ ...row, ...live, state: 'downloading', since: Date.now(), bytes: e.offset ?? row.bytes ?? 0, partialBytes: null, rate: null, etaSecs: null, retry: null, on: null, address: e.address ?? row.address });
    case 'progress':
      return finish({
        ...row,
        ...live,
        state: 'downloading',
        since: since(e.bytes),
        bytes: e.bytes,
        partialBytes: null,
        rate: typeof e.bytes_per_sec === 'number' ? e.bytes_per_sec : null,
        etaSecs: typeof e.eta_secs === 'number' ? e.eta_secs : null,
        retry: null,
        on: null,
        address: e.address ?? row.address,
      });
    case 'retrying':
      return finish({
        ...row,
        ...live,
        state: 'downloading',
        bytes: row.bytes ?? 0,
        rate: null,
        etaSecs: null,
        retry: Object.freeze({ attempt: e.attempt, of: e.of, waitMs: e.wait_ms, reason: e.reason, address: e.address }),
      });
    case 'fell_back':
      return finish({
        ...row,
        ...live,
        state: 'downloading',
        bytes: row.bytes ?? 0,
        rate: null,
        etaSecs: null,
        retry: null,
        address: e.to ?? row.address,
        fellBack: Object.freeze({ from: e.from, hop: e.hop ?? null, to: e.to, code: e.code, reason: e.reason }),
      });
    case 'waiting':
      return finish({ ...row, ...live, state: 'waiting', on: e.on ?? null, rate: null, etaSecs: null, retry: null });
    case 'verified':
      return finish({
        ...row,
        ...live,
        state: 'present',
        bytes: row.size,
        partialBytes: null,
        rate: null,
        etaSecs: null,
        retry: null,
        fellBack: null,
        on: null,
        path: e.path ?? null,
        servedBy: e.served_by ?? null,
      });
    case 'failed':
      return finish({
        ...row,
        ...live,
        state: 'failed',
        partialBytes: row.state === 'downloading' && row.bytes ? row.bytes : row.partialBytes,
        nextTry: typeof e.next_try === 'string' ? e.next_try : null,
        bytes: null,
        rate: null,
        etaSecs: null,
        retry: null,
        on: null,
        error: Object.freeze(describeError(e)),
      });
    case 'cancelled':
      return finish({
        ...row,
        ...live,
        state: 'missing',
        partialBytes: row.state === 'downloading' && row.bytes ? row.bytes : row.partialBytes,
        bytes: null,
        rate: null,
        etaSecs: null,
        retry: null,
        fellBack: null,
        on: null,
        cancelled: Object.freeze({ reason: e.reason ?? 'cancelled' }),
      });
    case 'deleted':
      return deletedRow(row, e);
    default:
      return null;
  }
}

/** How long `watchGem` waits before subscribing again after a lost feed, by failures in a row (ms). */
export const RETRY_DELAYS_MS = [250, 500, 1000, 2000, 5000];

/**
 * Keeps a model of `gem` true from `source`: anything with the client's
 * `subscribe({gem})` shape (a subscription: `status`, then its events as
 * an async iterator, and `close()`), and `status(gem)` (used when a
 * subscription has no `status` of its own). A subscription ended by
 * `lagged` (E_RESOURCE_LAGGED) is taken again at once and the rows redrawn
 * from its new status; one that ends otherwise (the connection lost) is
 * taken again after RETRY_DELAYS_MS, the model's `connection` saying
 * `lost` meanwhile. `onRows(rows, model)` is called after every change.
 *
 * A source that is an event emitter (the client of a store, which
 * reconnects by itself) is also listened to: 'disconnected' makes the
 * connection `lost` until its subscription yields `resubscribed`, or the
 * client says 'reconnected'.
 *
 * Returns `{model, ready, stop()}`: `ready` resolves once the first status
 * is drawn; `stop()` closes the subscription.
 */
export function watchGem(source, gem, onRows, { retryDelaysMs = RETRY_DELAYS_MS } = {}) {
  if (!source || typeof source.subscribe !== 'function') throw new TypeError('watchGem needs a source with subscribe({gem})');
  const model = new GemPageModel(gem);
  if (onRows) model.onChange((m) => onRows(m.rows, m));
  let stopped = false;
  let current = null;
  let wake = null;
  let readyResolve;
  const ready = new Promise((resolve) => {
    readyResolve = resolve;
  });

  // The client of a store says when its service went away and came back.
  const listening = typeof source.on === 'function' && typeof (source.off ?? source.removeListener) === 'function';
  const onDisconnected = (error) => {
    if (stopped) return;
    model.setConnection('lost', { error: { code: error?.code ?? 'E_RESOURCE_SERVICE', message: error?.message ?? 'the service went away' } });
  };
  const onReconnected = () => {
    if (!stopped && model.connection.state === 'lost') model.setConnection('live');
  };
  if (listening) {
    source.on('disconnected', onDisconnected);
    source.on('reconnected', onReconnected);
  }

  const pause = (ms) =>
    new Promise((resolve) => {
      const timer = setTimeout(done, ms);
      function done() {
        clearTimeout(timer);
        wake = null;
        resolve();
      }
      wake = done;
    });

  (async () => {
    let failures = 0;
    let lagged = null;
    while (!stopped) {
      let error = null;
      try {
        const sub = await source.subscribe({ gem });
        if (stopped) {
          closeQuietly(sub);
          break;
        }
        current = sub;
        const status = sub.status ?? (typeof source.status === 'function' ? await source.status(gem) : null);
        if (stopped) break;
        model.connection = Object.freeze({ state: 'live', ...(lagged ? { lagged } : {}), at: new Date().toISOString() });
        model.reset(status);
        readyResolve(model);
        failures = 0;
        lagged = null;
        for await (const event of sub) {
          if (stopped) break;
          model.apply(event);
        }
      } catch (e) {
        error = e;
      } finally {
        if (current) closeQuietly(current);
        current = null;
      }
      if (stopped) break;
      if (error && error.code === LAGGED) {
        // Fell behind: take the subscription again and redraw from its status.
        lagged = { missed: error.missed ?? null };
        continue;
      }
      const reason = error ?? { code: 'E_RESOURCE_SERVICE', message: 'the subscription ended' };
      model.setConnection('lost', { error: { code: reason.code ?? 'E_RESOURCE_SERVICE', message: reason.message ?? String(reason) } });
      await pause(retryDelaysMs[Math.min(failures, retryDelaysMs.length - 1)]);
      failures += 1;
      if (!stopped) model.setConnection('connecting', { error: model.connection.error });
    }
  })();

  return {
    model,
    ready,
    stop() {
      if (stopped) return;
      stopped = true;
      if (listening) {
        const off = (source.off ?? source.removeListener).bind(source);
        off('disconnected', onDisconnected);
        off('reconnected', onReconnected);
      }
      if (current) closeQuietly(current);
      if (wake) wake();
      model.setConnection('stopped');
    },
  };
}

function closeQuietly(sub) {
  try {
    if (typeof sub.close === 'function') sub.close();
    else if (typeof sub.return === 'function') sub.return();
  } catch {
    // already closed
  }
}

/**
 * A `watchGem` source over a host's own bridge, for a web view that is not
 * Electron's (Tauri, WebView2, WKWebView): `open(gem, onMessage)` asks the
 * host to feed `gem` and returns a function (or a promise of one) that
 * stops the feed. The host sends, as plain data, `{status}` first (its
 * `status(gem)`, taken after it subscribed), then `{event}` for each of
 * the gem's events, and `{lagged: missed}` when it fell behind (the page
 * then subscribes again); `{error: {code, message}}` ends the feed.
 * `examples/page_host.rs` is such a host.
 */
export function bridgeSource(open) {
  if (typeof open !== 'function') throw new TypeError('bridgeSource needs open(gem, onMessage)');
  return {
    async subscribe({ gem }) {
      const queue = [];
      let wake = null;
      let ended = null;
      let stop = null;
      let closed = false;
      let gotStatus;
      const first = new Promise((resolve, reject) => {
        gotStatus = { resolve, reject };
      });
      const push = (item) => {
        queue.push(item);
        if (wake) wake();
      };
      const onMessage = (message) => {
        if (closed || !message || typeof message !== 'object') return;
        if ('status' in message && gotStatus) {
          gotStatus.resolve(message.status);
          gotStatus = null;
        } else if (message.event) push({ event: message.event });
        else if ('lagged' in message) push({ error: Object.assign(new Error('the feed fell behind'), { code: LAGGED, missed: message.lagged }) });
        else if (message.error) {
          const error = Object.assign(new Error(message.error.message ?? 'the feed ended'), { code: message.error.code ?? 'E_RESOURCE_SERVICE' });
          if (gotStatus) gotStatus.reject(error);
          push({ error });
        }
      };
      stop = await open(gem, onMessage);
      const close = () => {
        if (closed) return;
        closed = true;
        ended = { done: true, value: undefined };
        if (typeof stop === 'function') stop();
        if (wake) wake();
      };
      let status;
      try {
        status = await first;
      } catch (e) {
        close();
        throw e;
      }
      const next = async () => {
        for (;;) {
          const item = queue.shift();
          if (item?.error) {
            close();
            throw item.error;
          }
          if (item) return { done: false, value: item.event };
          if (ended) return ended;
          await new Promise((resolve) => {
            wake = () => {
              wake = null;
              resolve();
            };
          });
        }
      };
      return {
        status,
        next,
        close,
        return: async () => {
          close();
          return { done: true, value: undefined };
        },
        [Symbol.asyncIterator]() {
          return this;
        },
      };
    },
  };
}
