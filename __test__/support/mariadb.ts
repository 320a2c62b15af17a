// The mysqlStore suites' servers: a throwaway MariaDB (scripts/mariadb-server.js), or TEST_MYSQL_URL in
// the plain suites (never in the fault tests, which restart the server and change its settings).
import { startMariadb, type MariadbServer } from '../../scripts/mariadb-server.js';

export { PASSWORD, startMariadb } from '../../scripts/mariadb-server.js';
export type { MariadbOptions, MariadbServer } from '../../scripts/mariadb-server.js';

/** The server of the plain suites: TEST_MYSQL_URL's, else a throwaway one. */
export async function plainMariadb(): Promise<Pick<MariadbServer, 'url' | 'stop'>> {
  const url = process.env.TEST_MYSQL_URL;
  if (url) return { url, stop: async () => undefined };
  return startMariadb();
}
