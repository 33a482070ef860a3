// An app instance for takeover.test.js (not a test itself): run by Node
// with APP_BIN, APP_STORE, APP_CONFIG and APP_MODE in its environment.
//   serve: starts the store's service, prints {pid}, and waits.
//   wait:  connects with takeOver, prints {pid, started} (its service's
//          pid, and those of the services it started), and waits.
//   path:  the same, then waits for `path APP_GEM APP_ID` and prints
//          {path, pid} (or {error}).

import { connect, startService } from '../index.js';

const { APP_BIN: bin, APP_STORE: store, APP_CONFIG: config, APP_MODE: mode } = process.env;

if (mode === 'serve') {
  const service = await startService({ bin, store, config });
  console.log(JSON.stringify({ pid: service.pid }));
} else {
  const client = await connect({ store, takeOver: { bin, config }, reconnect: 15_000 });
  console.log(JSON.stringify({ pid: client.service.pid, started: client.startedServices.map((s) => s.pid) }));
  if (mode === 'path') {
    try {
      const { path } = await client.path(process.env.APP_GEM, process.env.APP_ID);
      console.log(JSON.stringify({ path, pid: client.service.pid }));
    } catch (e) {
      console.log(JSON.stringify({ error: `${e.code}: ${e.message}` }));
    }
    client.close();
    process.exit(0);
  }
}
