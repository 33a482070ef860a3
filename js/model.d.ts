// Types of gem-resources-client/model: the gem page's model (framework-free).

import type { ErrorCode, Event, GemStatus, PolicyMode, ResourceState, Status } from './index.js';

/** A failure in words. */
export interface RowError {
  /** What the call could not do, e.g. `E_RESOURCE_UNAVAILABLE`. */
  code: ErrorCode;
  /** The most specific cause, e.g. `E_RESOURCE_POLICY`. */
  primaryCause: ErrorCode;
  /** The service's whole message. */
  message: string;
  /** True when the network policy refused the download. */
  policy: boolean;
  /** A few words for the cause: `Blocked by the network policy`. */
  headline: string;
  /** The reason of each address: `host cdn.test is not permitted by the network policy (blocklist mode)`. */
  detail: string;
  /** `headline: detail (codes)`. */
  text: string;
}

/** One file of the gem, as the page draws it. Frozen; a change makes a new row. */
export interface Row {
  id: string;
  label: string;
  /** The manifest's description, or null. */
  description: string | null;
  file: string | null;
  /** Declared size in bytes. */
  size: number | null;
  /** The host it comes from, without a port (the status row's `host`). */
  host: string | null;
  /** Every host it may come from (url and mirrors). */
  hosts: string[];
  /** True: downloads right after install (eager); false: only when used (lazy). */
  required: boolean;
  /** Same as `required`. */
  eager: boolean;
  /** `install` (right after install) or `use` (when first used). */
  when: 'install' | 'use';
  sha256: string | null;
  state: ResourceState;
  /** Bytes held: while downloading (or the bytes of the download waited for); `size` when present. */
  bytes: number | null;
  /** bytes / size while downloading or waiting, 1 when present, else null. */
  fraction: number | null;
  /** Bytes kept from a stopped or failed download. */
  partialBytes: number | null;
  /** The service's rate (`bytes_per_sec` of the last progress), or null. */
  rate: number | null;
  /** The service's time left (`eta_secs`), or null when it cannot be told. */
  etaSecs: number | null;
  /** When the download started or resumed here (ms since the epoch); its time left reads `--` for ETA_AFTER_MS. Null for one under way when the status was read. */
  since: number | null;
  /** A failed required file: when the service tries it again by itself (RFC 3339, `next_try`). */
  nextTry: string | null;
  /** The address being tried. */
  address: string | null;
  /** When waiting: the gem whose download of the same file it waits for. */
  on: string | null;
  retry: { attempt: number; of: number; waitMs: number; reason: string; address: string } | null;
  fellBack: { from: string; hop: string | null; to: string; code: ErrorCode; reason: string } | null;
  cancelled: { reason: string } | null;
  error: RowError | null;
  /** True when failed because the network policy refused it. */
  blocked: boolean;
  path: string | null;
  servedBy: string | null;
  /** When the service observed the row's last event. */
  at: string | null;
  /** The state in words, e.g. `Downloading: 1.0 MiB of 3.0 MiB (33%), 128.0 KiB/s, about 16 s left`. */
  text: string;
}

export interface PolicyNote {
  mode: PolicyMode;
  /** How many host patterns the new policy lists. */
  hosts: number;
  oldMode: PolicyMode;
  oldHosts: number;
  at: string | null;
}

export interface Connection {
  state: 'connecting' | 'live' | 'lost' | 'stopped';
  error?: { code: string; message: string };
  /** Set after a subscription that fell behind was taken again. */
  lagged?: { missed: number | null };
  at: string | null;
}

/** The client's item after the service restarted: draw from `status`. */
export interface Resubscribed {
  event: 'resubscribed';
  at: string;
  reason: string;
  status: GemStatus[];
}

export class GemPageModel {
  constructor(gem: string);
  readonly gem: string;
  /** null until a status was given. */
  installed: boolean | null;
  /** In manifest order; a new frozen array after each change. */
  rows: readonly Row[];
  /** The last `policy_changed`, or null. */
  policy: PolicyNote | null;
  connection: Connection;
  /** The `at` of the last event applied. */
  at: string | null;
  row(id: string): Row | undefined;
  /** Called after every change; returns a function that stops it. */
  onChange(cb: (model: GemPageModel) => void): () => void;
  /** Rebuilds the rows from a `status` answer, a subscription's `status`, or one GemStatus. */
  reset(status: Status | GemStatus[] | GemStatus | null): void;
  /** Applies an event of the subscription; whether anything changed. */
  apply(event: Event | Resubscribed): boolean;
  setConnection(state: Connection['state'], fields?: Partial<Connection>): void;
}

/** What `watchGem` reads: the client, `client.forGem(gem)`-like objects, a preload's bridge, the relay's browser source. */
export interface GemSource {
  /** When present (the client of a store): 'disconnected' and 'reconnected' are listened to. */
  on?(event: 'disconnected' | 'reconnected', listener: (arg: unknown) => void): unknown;
  off?(event: 'disconnected' | 'reconnected', listener: (arg: unknown) => void): unknown;
  subscribe(options: { gem: string }): Promise<AsyncIterable<Event | Resubscribed> & { status?: GemStatus[]; close?(): void }>;
  status?(gem: string): Promise<Status | GemStatus[] | GemStatus>;
  /** The page's buttons call these when present (the client's methods), or as `actions` allows. */
  retry?(gem: string, id: string): Promise<unknown>;
  downloadNow?(gem: string, id: string): Promise<unknown>;
  cancel?(gem: string, id: string): Promise<unknown>;
  /** The actions allowed (a relay's source: none unless the app enabled them). */
  actions?: ('retry' | 'downloadNow' | 'cancel')[];
}

export interface Watch {
  model: GemPageModel;
  /** Resolves once the first status is drawn. */
  ready: Promise<GemPageModel>;
  stop(): void;
}

/** Waits before subscribing again after a lost feed, by failures in a row (ms). */
export const RETRY_DELAYS_MS: number[];

/**
 * Keeps a model of `gem` true from `source`: resubscribes at once after
 * `lagged` (redrawing from the new status), after RETRY_DELAYS_MS when the
 * feed is lost; redraws from a `resubscribed` item; shows the connection
 * `lost` between a client's 'disconnected' and its subscription's
 * `resubscribed` (or 'reconnected'); `onRows(rows, model)` after every change.
 */
export function watchGem(
  source: GemSource,
  gem: string,
  onRows?: (rows: readonly Row[], model: GemPageModel) => void,
  options?: { retryDelaysMs?: number[] },
): Watch;

/** What a host sends over its bridge for one gem's feed (see `bridgeSource`). */
export type BridgeMessage =
  | { status: Status | GemStatus[] | GemStatus }
  | { event: Event }
  | { lagged: number | null }
  | { error: { code?: string; message?: string } };

/**
 * A source over a host's own bridge (Tauri, WebView2, WKWebView):
 * `open(gem, onMessage)` starts the host's feed of `gem` and returns what
 * stops it. The host sends `{status}` first, then `{event}`s, `{lagged}`
 * when it fell behind, `{error}` to end.
 */
export function bridgeSource(
  open: (gem: string, onMessage: (message: BridgeMessage) => void) => (() => void) | Promise<() => void>,
): GemSource;

export function describeError(error: { code?: ErrorCode; primary_cause?: ErrorCode; message?: string; attempts?: { code: ErrorCode; reason: string }[] }): RowError;
export function stateText(row: Omit<Row, 'text'>, now?: number): string;
/** How long a download's time left reads `--` after it starts or resumes (ms). */
export const ETA_AFTER_MS: number;
/** Whether a row's time left still reads `--` at `now` (ms). */
export function etaHeld(row: Omit<Row, 'text'>, now?: number): boolean;
/** `18:31` (`18:31:05` with seconds): a time of day as the page writes every one (local time, 24 hours). */
export function timeOfDay(when: Date | string, options?: { seconds?: boolean }): string;
/** `at 07:38`, `tomorrow at 07:38`, `on 2026-12-08 at 07:38` (local time). */
export function formatClock(iso: string, now?: Date): string;
/** `34.0 MiB of 200.0 MiB kept; tries again at 07:38`, or ''. */
export function afterFailure(row: Omit<Row, 'text'>, now?: Date): string;
export function formatBytes(n: number): string;
export function formatRate(bytesPerSec: number): string;
export function formatDuration(secs: number): string;
