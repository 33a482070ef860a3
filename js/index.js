// Client of the gem-resources service's local API, protocol 1 (PROTOCOL.md
// at the root of the repository is the contract).
//
// One JSON-RPC 2.0 message per line over a Unix domain socket (a named pipe
// on Windows). Answers are matched to requests by id, whatever their order.
// Each subscription gets a connection of its own: its events are its alone,
// and a page that reads them slowly never delays the answers of the client.
//
// A client never sends a byte to a service that is not its own user's,
// holding this store: before each connection it checks that the socket and
// its folder are the user's own, and the first message is `hello` with a
// random nonce, which the service must answer with the proof that it holds
// the secret of the store's service.json (see "How the client knows its
// service" in README.md). Every new connection is checked so, against the
// service.json of that moment: after the service restarts, the client checks
// the new service (its pid, its secret) before it sends it anything else.
//
// When the service goes away (it stopped, or was killed), a client of a store
// looks for the next one for a while (`reconnect`) and says so
// ('disconnected', 'reconnected'); its subscriptions subscribe again. A call
// the service did not answer before it went rejects with E_RESOURCE_SERVICE
// (see "When the service restarts" in README.md).
//
// The code lives in lib/, one concern a file: errors.js (the errors),
// connection.js (framing, requests, cancellation), dial.js (service.json,
// the socket's checks, the `hello` proof), reconnect.js (the next
// service), client.js (`connect` and the calls), subscription.js (events),
// service.js (`startService`: an app's own service).

export { Client, GemResources, connect } from './lib/client.js';
export { ANSWER_TIMEOUT_MS, CANCEL_ANSWER_MS, HELLO_TIMEOUT_MS, MAX_LINE_FROM_SERVICE } from './lib/connection.js';
export { findService, storeLayout } from './lib/dial.js';
export { E_RESOURCE_CANCELLED, E_RESOURCE_LAGGED, E_RESOURCE_SERVICE, PROTOCOL, ResourceError } from './lib/errors.js';
export { RECONNECT_MS, TAKE_OVER_JITTER_MS } from './lib/reconnect.js';
export { E_RESOURCE_BUSY, START_TIMEOUT_MS, startService } from './lib/service.js';
export { Subscription } from './lib/subscription.js';
