// Types of gem-resources-client: the local API of gem-resources, protocol 1.

/** The protocol this client speaks. */
export const PROTOCOL: 1;
/** The connection to the service failed, closed, or no service listens (a client-side code). */
export const E_RESOURCE_SERVICE: 'E_RESOURCE_SERVICE';
/** A subscription fell behind and the service ended it. */
export const E_RESOURCE_LAGGED: 'E_RESOURCE_LAGGED';
/** A call was cancelled: by its AbortSignal, or by `$/cancelRequest`. */
export const E_RESOURCE_CANCELLED: 'E_RESOURCE_CANCELLED';
/** How long an aborted `path` or `autofill` waits for the service's answer, for `downloadOutcome` (ms). */
export const CANCEL_ANSWER_MS: number;
/** The longest line the client reads from a service (characters); past it the connection fails with E_RESOURCE_SERVICE. */
export const MAX_LINE_FROM_SERVICE: number;
/** How long `connect` (and each subscription) waits for `hello` on a new connection, in ms. */
export const HELLO_TIMEOUT_MS: number;
/** How long a call other than `path` and `autofill` waits for its answer, in ms (30 000; `connect`'s `answerTimeoutMs` changes it). */
export const ANSWER_TIMEOUT_MS: number;
/** How long a client of a store looks for a new service after losing its own, in ms (30 000; `connect`'s `reconnect` changes it). */
export const RECONNECT_MS: number;
/** The longest random pause (ms, 150) of a client with `takeOver` that lost its service before it looks again and starts the next. */
export const TAKE_OVER_JITTER_MS: number;
/** Another service holds the store: the code `startService` rejects with, `pid` naming the holder. */
export const E_RESOURCE_BUSY: 'E_RESOURCE_BUSY';
/** How long `startService` waits for `serve` to listen, in ms (30 000), unless `timeoutMs` says otherwise. */
export const START_TIMEOUT_MS: number;

/** The library's stable error codes, and this client's own two. */
export type ErrorCode =
  | 'E_PERM_INVALID'
  | 'E_RESOURCE_SCHEME'
  | 'E_RESOURCE_ADDRESS'
  | 'E_RESOURCE_POLICY'
  | 'E_RESOURCE_REDIRECTS'
  | 'E_RESOURCE_HTTP'
  | 'E_RESOURCE_NETWORK'
  | 'E_RESOURCE_SIZE'
  | 'E_RESOURCE_SHA256'
  | 'E_RESOURCE_DISK_SPACE'
  | 'E_RESOURCE_UNAVAILABLE'
  | 'E_RESOURCE_NOT_FOUND'
  | 'E_RESOURCE_CANCELLED'
  | 'E_RESOURCE_IO'
  | 'E_RESOURCE_CONFIG'
  | 'E_RESOURCE_GEM_ID'
  | 'E_RESOURCE_SHUTDOWN'
  | 'E_RESOURCE_RUNTIME'
  | 'E_RESOURCE_BUSY'
  | 'E_RESOURCE_USAGE'
  | 'E_RESOURCE_SERVICE'
  | 'E_RESOURCE_OWNER'
  | 'E_RESOURCE_LAGGED'
  | (string & {});

/** One address tried, with its own code and reason. */
export interface Attempt {
  address: string;
  hop: string | null;
  code: ErrorCode;
  reason: string;
  [key: string]: unknown;
}

/** The library's error, as the `data` of a JSON-RPC error (and `--json` errors). */
export interface ErrorData {
  code: ErrorCode;
  primary_cause: ErrorCode;
  message: string;
  resource?: string;
  attempts?: Attempt[];
  [key: string]: unknown;
}

/** An error of the service, or of the connection to it. */
export class ResourceError extends Error {
  constructor(
    message: string,
    fields?: { code?: ErrorCode; primaryCause?: ErrorCode; attempts?: Attempt[]; data?: ErrorData; rpcCode?: number },
  );
  /** `data.code`, e.g. `E_RESOURCE_UNAVAILABLE`; `E_RESOURCE_SERVICE` for the connection. */
  code: ErrorCode;
  /** `data.primary_cause`, e.g. `E_RESOURCE_POLICY`. */
  primaryCause: ErrorCode;
  /** `data.attempts`: each address with its own code and reason (empty when none). */
  attempts: Attempt[];
  /** The whole `data` object of the error answer. */
  data: ErrorData | undefined;
  /** The JSON-RPC code: -32000 for the library's errors, -32700, -32600, -32601, -32602. */
  rpcCode: number | undefined;
  /** With `E_RESOURCE_LAGGED`: the events missed. */
  missed?: number;
  /** With `E_RESOURCE_LAGGED`: the service's number of the subscription. */
  subscription?: number;
  /** With `E_RESOURCE_BUSY` from `startService`: the process that holds the store. */
  pid?: number;
  /** From `startService`: the tail of what `serve` said on its standard error. */
  stderr?: string;
  /** True when the call's own AbortSignal cancelled it (code `E_RESOURCE_CANCELLED`; `cause` is the signal's reason). */
  aborted?: boolean;
  /**
   * With `E_RESOURCE_CANCELLED`: what became of the download once the
   * service said so: `continues` (someone else still needs the file) or
   * `stopped` (its bytes kept for the next call). Undefined until known.
   */
  download?: DownloadOutcome;
  /**
   * With `aborted`: a promise of `download`, or `'unknown'` when the
   * service will not tell (nothing was sent, `install`, the call had
   * finished already, the connection closed, or no answer within
   * CANCEL_ANSWER_MS). Never rejects.
   */
  downloadOutcome?: Promise<DownloadOutcome | 'unknown'>;
  static fromRpc(error: { code: number; message: string; data?: ErrorData }): ResourceError;
}

/** What became of a download when a call waiting for it was cancelled. */
export type DownloadOutcome = 'continues' | 'stopped';

/** `{signal}`: aborting it rejects the call at once with E_RESOURCE_CANCELLED (`aborted: true`). */
export interface CallOptions {
  signal?: AbortSignal;
}

export interface PathOptions extends CallOptions {
  /**
   * Called with each of this call's own events (`$/progress`), in order,
   * the last one (`verified`, `failed`) before the promise settles. An
   * exception it throws cancels the call, which rejects with it.
   */
  onProgress?: (event: CallEvent) => void;
}

/** What `<store>/store-v1/service.json` says, without its `secret` (which only `connect` reads). */
export interface ServiceInfo {
  protocol: number;
  socket: string;
  pid: number;
  version: string;
}

export interface Hello {
  protocol: number;
  version: string;
  store: string;
  pid: number;
  /**
   * Asked with a `nonce`: hex(HMAC-SHA256(key: service.json's `secret` as
   * written, message: "gem-resources hello\n" + nonce)). Present in
   * `client.service` of a client connected through `{store}`.
   */
  proof?: string;
}

export type ResourceState = 'present' | 'missing' | 'queued' | 'downloading' | 'retrying' | 'waiting' | 'failed';

/** One row of `status --json`. */
export interface ResourceStatus {
  id: string;
  label: string;
  file: string;
  size: number;
  description?: string;
  host: string;
  addresses: string[];
  hosts: string[];
  required: boolean;
  sha256: string;
  state: ResourceState;
  /** When present. */
  path?: string;
  /** When present: the url or mirror that served it, `"import"`, or null. */
  served_by?: string | null;
  /** When downloading: the bytes really held; when waiting: the bytes the download waited for holds. */
  bytes?: number;
  /** When this service downloads it: the current rate, as its progress events say; null for another process's download. */
  bytes_per_sec?: number | null;
  /** When waiting: the gem whose download of the same file it waits for (null: not known). */
  on?: string | null;
  /** When retrying (between two tries of an address, until bytes arrive again): the next try, of how many, and why the last failed. */
  attempt?: number;
  of?: number;
  reason?: string;
  /** When failed. */
  code?: ErrorCode;
  primary_cause?: ErrorCode;
  message?: string;
  attempts?: Attempt[];
  at?: string;
  /** Bytes of an interrupted download kept for resuming. */
  partial_bytes?: number;
  /** On a failed required file: when the service tries it again by itself (RFC 3339). */
  next_try?: string;
  [key: string]: unknown;
}

export interface GemStatus {
  gem: string;
  /** The manifest's `name`, when it has one. */
  name?: string;
  resources: ResourceStatus[];
}

export interface Status {
  gems: GemStatus[];
  undeclared_files: number;
  undeclared_bytes: number;
  service: { socket: string; pid: number };
  /** The store folder that was read. */
  store: string;
}

export interface PathResult {
  gem: string;
  resource: string;
  path: string;
}

/** A manifest entry (`resources[]` of notochord.json or manifest.json). */
export interface ManifestResource {
  id: string;
  url: string;
  mirrors?: string[];
  sha256?: string;
  size?: number;
  required?: boolean;
  description?: string;
}

export interface Manifest {
  resources?: ManifestResource[];
  [key: string]: unknown;
}

export interface InstallReport {
  gem: string;
  upgrade: boolean;
  unchanged: boolean;
  resources: number;
  present: number;
  queued: number;
  deleted: string[];
  [key: string]: unknown;
}

export interface UninstallReport {
  gem: string;
  installed: boolean;
  deleted: string[];
  kept: string[];
}

export interface Changed {
  changed: boolean;
}

export interface Autofilled {
  size: number;
  sha256: string;
  served_by: string;
  /** `autofill {url}`: the address that finally answered, after redirects. */
  final_url?: string;
}

/** How far an `autofill` call has read one resource (its `onProgress`). */
export interface AutofillProgress {
  event: 'autofill_progress';
  /** The resource id (for one address, the last part of its path). */
  resource: string;
  /** The address being read (the url or a mirror, as declared). */
  address: string;
  /** Bytes read so far from that address. */
  bytes: number;
  /** Its size once the server announced it, else null. */
  size: number | null;
  /** The resource is read (its values are in the answer) or failed at every address. */
  done: boolean;
}

/** `autofill`'s options: `onProgress` is called as it reads (at most every 100 ms per resource, plus each address's first and the last). */
export interface AutofillOptions extends CallOptions {
  onProgress?: (progress: AutofillProgress) => void;
}

/** How one address of a resource answered when every address was read. */
export interface AddressReport {
  /** `url`, `mirror 1`, `mirror 2`, … */
  role: string;
  address: string;
  ok: boolean;
  size: number | null;
  sha256: string | null;
  /** Why it is not ok: `SHA-256 differs from the url's`, `HTTP status 404`. */
  problem: string | null;
  /** The redirect target where reading it failed, when not `address` itself. */
  hop: string | null;
  code: ErrorCode | null;
}

export type AutofillResource =
  | ({
      id: string;
      addresses?: AddressReport[];
      /** The verdict: every address read served these values (the values of `served_by`). */
      ok: boolean;
      /** The `role` of each address that failed or served other bytes: the row to point at. */
      disagreeing?: string[];
    } & Autofilled)
  | { id: string; addresses?: AddressReport[]; code: ErrorCode; primary_cause: ErrorCode; message: string; [key: string]: unknown };

export interface AutofilledManifest {
  /** Whether every resource was filled and every address agreed. */
  ok: boolean;
  manifest: Manifest;
  resources: AutofillResource[];
}

export type PolicyMode = 'allowlist' | 'blocklist';

export interface Policy {
  mode: PolicyMode;
  hosts: string[];
}

export interface PolicyChange {
  /** Downloads stopped because the new policy refuses their host. */
  stopped: number;
  /** Failed files queued again because it permits them now. */
  queued: number;
}

interface Timed {
  /** When the service observed it: RFC 3339, UTC, milliseconds. */
  at: string;
}

interface OfFile extends Timed {
  gem: string;
  resource: string;
  sha256: string;
}

/** The service's events (`params` of an `event` notification). */
export type Event =
  | ({ event: 'installed'; gem: string; resources: ResourceStatus[] } & Timed)
  | ({ event: 'uninstalled'; gem: string } & Timed)
  /** `old_hosts`, `new_hosts`: how many host patterns each policy lists. */
  | ({ event: 'policy_changed'; old_mode: PolicyMode; old_hosts: number; new_mode: PolicyMode; new_hosts: number } & Timed)
  | ({ event: 'queued'; size: number } & OfFile)
  | ({ event: 'started'; size: number; address: string } & OfFile)
  | ({ event: 'resumed'; offset: number; size: number; address: string } & OfFile)
  | ({
      event: 'progress';
      bytes: number;
      size: number;
      address: string;
      /** This try's rate over the last three seconds (a resumed prefix never counts). */
      bytes_per_sec: number;
      /** Seconds left at that rate; null when it cannot be told (no rate yet, or stalled). */
      eta_secs: number | null;
    } & OfFile)
  | ({ event: 'retrying'; address: string; attempt: number; of: number; wait_ms: number; reason: string } & OfFile)
  | ({ event: 'fell_back'; from: string; hop: string | null; to: string; code: ErrorCode; reason: string } & OfFile)
  | ({ event: 'waiting'; on?: string } & OfFile)
  | ({ event: 'verified'; path: string; served_by: string } & OfFile)
  | ({ event: 'failed'; code: ErrorCode; primary_cause: ErrorCode; message: string; next_try?: string | null } & OfFile)
  | ({ event: 'cancelled'; reason: string } & OfFile)
  | ({ event: 'deleted' } & OfFile);

/** The events one `path` call reports of its own resource. */
export type CallEvent = Extract<
  Event,
  { event: 'queued' | 'started' | 'resumed' | 'progress' | 'waiting' | 'retrying' | 'fell_back' | 'verified' | 'failed' | 'cancelled' }
>;

/** The last item of a `pull`: the file's local path. */
export interface PulledPath {
  event: 'path';
  gem: string;
  resource: string;
  path: string;
}

/**
 * One `path` call as an async iterator: its own events, then a
 * `PulledPath`, then the end. The call is sent at the first `next()`;
 * it throws the call's error (after the events received before), and
 * `return()` (leaving a `for await` loop early) cancels the call on the
 * service, resolving once the service answered (at most CANCEL_ANSWER_MS).
 */
export interface Pull extends AsyncIterableIterator<CallEvent | PulledPath> {
  next(): Promise<IteratorResult<CallEvent | PulledPath, undefined>>;
  return(): Promise<IteratorResult<CallEvent | PulledPath, undefined>>;
}

/**
 * The item a subscription yields after the service restarted, once it has
 * subscribed again on the new service: redraw from `status` (also in
 * `sub.status` now), then apply the events that follow, the new service's.
 */
export interface Resubscribed {
  event: 'resubscribed';
  /** When the client subscribed again: RFC 3339, UTC, milliseconds (the client's clock). */
  at: string;
  reason: 'service restarted';
  /** The new service's status, as the answer to `subscribe` gives it. */
  status: GemStatus[];
}

/** What a subscription yields: the service's events, and `resubscribed` after a restart. */
export type SubscriptionItem = Event | Resubscribed;

/**
 * One subscription's events: `for await (const event of sub)`. Ends after
 * `close()`; throws `E_RESOURCE_LAGGED` after the service ended it for
 * falling behind (subscribe again, redraw from the new `status`). When the
 * service goes away, a subscription through `{store}` subscribes again on
 * the next one and yields a `Resubscribed`; it throws `E_RESOURCE_SERVICE`
 * when none came back within the client's `reconnect` ms (at once through
 * `{socket}`, or with `reconnect: 0`), or when the service closed it while
 * still running.
 */
export class Subscription implements AsyncIterableIterator<SubscriptionItem> {
  /** The status as of the subscription (the new service's after a restart): draw from it, then apply the events. */
  readonly status: GemStatus[];
  /** The service's number for it (the new service's after a restart). */
  readonly id: number | null;
  next(): Promise<IteratorResult<SubscriptionItem, undefined>>;
  return(): Promise<IteratorResult<SubscriptionItem, undefined>>;
  [Symbol.asyncIterator](): Subscription;
  /** Sends `unsubscribe` and ends the iteration once the events received are read. */
  close(): void;
}

/** One gem's resources: what a tool's `ctx.resources` is. */
export class GemResources {
  readonly gem: string;
  /** The file's local path, downloading it first when missing. */
  path(id: string, options?: PathOptions): Promise<string>;
  /** The call's own events, then `{event: 'path', path, …}`: `for await (const e of resources.pull(id))`. */
  pull(id: string, options?: CallOptions): Pull;
  status(): Promise<GemStatus>;
  downloadNow(id: string): Promise<Changed>;
  cancel(id: string): Promise<Changed>;
  retry(id: string): Promise<Changed>;
  subscribe(): Promise<Subscription>;
}

/** What `'reconnected'` tells: the answers to `hello` of the new service and of the one that went away. */
export interface Reconnected {
  service: Hello;
  previous: Hello | null;
}

/**
 * A client of the service (a Node `EventEmitter`). Through `{store}` it
 * outlives the service: when the connection is lost it emits
 * `'disconnected'`, looks for the next service for `reconnect` ms
 * (checking it as `connect` does), and emits `'reconnected'`. Calls made
 * meanwhile wait for it; a call in flight when the service went away
 * rejects with `E_RESOURCE_SERVICE`, unless it changes nothing (`path`,
 * `status`, `policy`, `hello`, `autofill`) and the client resends
 * (`resend`, on with `takeOver`): it is then sent again to the next
 * service. With `takeOver`, the client starts the next service itself.
 */
export class Client {
  /** The socket (or named pipe) it is connected to (the new service's after a restart). */
  readonly socketPath: string;
  /** The answer to `hello` that `connect` checked (with its `proof` through `{store}`); the new service's after a restart. */
  service: Hello | null;
  /** What `startService` resolved with for each service this client started (`takeOver` with options), oldest first. */
  readonly startedServices: StartedService[];
  /** The connection to the service was lost; the client looks for the next service. */
  on(event: 'disconnected', listener: (error: ResourceError) => void): this;
  /** A new service took over, checked as `connect` checks one. */
  on(event: 'reconnected', listener: (change: Reconnected) => void): this;
  once(event: 'disconnected', listener: (error: ResourceError) => void): this;
  once(event: 'reconnected', listener: (change: Reconnected) => void): this;
  off(event: 'disconnected', listener: (error: ResourceError) => void): this;
  off(event: 'reconnected', listener: (change: Reconnected) => void): this;
  /** Any method, by name; its result. With `signal`, `path` and `autofill` are also cancelled on the service. */
  request<T = unknown>(method: string, params?: object, options?: CallOptions): Promise<T>;
  hello(): Promise<Hello>;
  status(gem?: string): Promise<Status>;
  /** Downloading first when missing; `signal` cancels the call (`$/cancelRequest`), `onProgress` gets its own events. */
  path(gem: string, id: string, options?: PathOptions): Promise<PathResult>;
  /** The call's own events, then `{event: 'path', gem, resource, path}`; leaving the loop early cancels the call. */
  pull(gem: string, id: string, options?: CallOptions): Pull;
  /** `signal` only stops waiting: the service does not cancel an install. */
  install(gem: string, manifest: Manifest, options?: CallOptions): Promise<InstallReport>;
  uninstall(gem: string): Promise<UninstallReport>;
  downloadNow(gem: string, id: string): Promise<Changed>;
  cancel(gem: string, id: string): Promise<Changed>;
  retry(gem: string, id: string): Promise<Changed>;
  autofill(url: string, options?: AutofillOptions): Promise<Autofilled>;
  autofillManifest(manifest: Manifest, options?: AutofillOptions & { all?: boolean; urlOnly?: boolean }): Promise<AutofilledManifest>;
  policy(): Promise<Policy>;
  setPolicy(policy: Policy): Promise<PolicyChange>;
  subscribe(options?: { gem?: string }): Promise<Subscription>;
  forGem(gem: string): GemResources;
  /** Closes the connection and its subscriptions, and stops looking for a service; pending and later calls reject with E_RESOURCE_SERVICE. */
  close(): void;
}

/** `<store>/store-v1`. */
export function storeLayout(store: string): string;
/** What `<store>/store-v1/service.json` says (without its secret), or null when there is none. */
export function findService(store: string): Promise<ServiceInfo | null>;
export interface ConnectOptions {
  /** How long a call other than `path` and `autofill` waits for its answer, in ms (default `ANSWER_TIMEOUT_MS`). */
  answerTimeoutMs?: number;
  /**
   * How long to wait for a service to appear, in ms (default 0: reject at
   * once when none listens). service.json is read again at each try.
   */
  wait?: number;
  /**
   * How long a client of a store looks for the next service after losing
   * its own, in ms (default `RECONNECT_MS`, 30 000): calls made meanwhile
   * wait that long at most, and a subscription too before it ends. `0` or
   * `false`: never; the client then ends with its connection, as does every
   * client of `{socket}`.
   */
  reconnect?: number | false;
  /** The app that runs the service, named in messages: "Notes's resource service is not running: start Notes (…)". */
  appName?: string;
  /**
   * Through `{store}` only: this client is one of the instances that keep
   * the store's service running. When no service listens (at `connect`,
   * or after the client lost its own, then after a random pause of up to
   * `TAKE_OVER_JITTER_MS`), it starts one: `true` or the options of
   * `startService` (the store is the client's), or a function that starts
   * one and rejects with code `E_RESOURCE_BUSY` when another holds the
   * store. On `E_RESOURCE_BUSY` another instance won: the client connects
   * to its service. `wait` is then 10 000 ms unless given.
   */
  takeOver?: boolean | Omit<StartServiceOptions, 'store'> | ((where: { store: string }) => Promise<unknown>);
  /**
   * Whether a call that changes nothing (`path`, `status`, `policy`,
   * `hello`, `autofill`), cut off by the service going away, is sent again
   * to the next service (default: true with `takeOver`, else false). Calls
   * that change the store are never sent again.
   */
  resend?: boolean;
}

export interface StartServiceOptions {
  /** The program (default `gem-resources`, found on PATH). */
  bin?: string;
  /** The store folder (`--store`). */
  store?: string;
  /** The configuration file (`--config`). */
  config?: string;
  /** A gems folder `serve` keeps installed (`--gems`); none for an app that installs through the API. */
  gems?: string;
  /** More arguments of `serve`. */
  args?: string[];
  /** Variables added to this process's environment. */
  env?: Record<string, string>;
  /** How long to wait for `serve` to listen, in ms (default `START_TIMEOUT_MS`). */
  timeoutMs?: number;
  /** Each event `serve` prints after `listening`. */
  onEvent?: (event: Record<string, unknown>) => void;
}

export interface StartedService {
  /** The `serve` process; `child.kill('SIGTERM')` stops it, keeping what it downloaded. */
  child: import('node:child_process').ChildProcess;
  /** The socket it listens on. */
  socket: string;
  pid: number;
  /** Its exit. */
  exited: Promise<{ code: number | null; signal: string | null }>;
}

/**
 * Starts `gem-resources serve --json --parent-pid <this pid>
 * --exit-with-stdin` on a store, its standard input a pipe this process
 * keeps open: the service stops (keeping what it downloaded) when this
 * process ends, `kill -9` included. Resolves once it listens; rejects with
 * `E_RESOURCE_BUSY` (`pid`: the holder) when another service holds the
 * store, with the service's own code and message (`stderr`: its tail) for
 * another error, or with `E_RESOURCE_SERVICE` when it could not start or
 * exited before saying anything (its exit status and stderr's tail).
 */
export function startService(options?: StartServiceOptions): Promise<StartedService>;

/**
 * A client of the service of a store (found through its service.json), or
 * of a socket. The socket and its folder must be the user's own, the folder
 * closed to others (not checked on Windows); through `{store}` the service
 * must also prove, in its answer to `hello`, that it holds service.json's
 * secret and is the process the file names; so must every service the
 * client later reconnects to, against the service.json of that moment.
 * `{socket}` proves no more than the owner checks. Rejects with
 * `E_RESOURCE_SERVICE` otherwise (after `wait` ms, when given).
 */
export function connect(options: ({ store: string } | { socket: string }) & ConnectOptions): Promise<Client>;
