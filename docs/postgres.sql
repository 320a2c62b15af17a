-- The table postgresStore keeps its fixed-window counters in: seed 000's layout, so an app on the
-- seed's sketch switches with no migration. postgresStore creates it on first use; run this yourself
-- (and pass createTable: false) where the app's database user has no DDL rights. Use the same name
-- as the store's `table` (and `schema`) options; the default is askdare_counters.
CREATE TABLE IF NOT EXISTS askdare_counters (
  key      text        PRIMARY KEY,
  total    bigint      NOT NULL,
  reset_at timestamptz NOT NULL
);

-- The app's user needs only these rights on it:
-- GRANT SELECT, INSERT, UPDATE, DELETE ON askdare_counters TO app_user;

-- Ended windows are restarted in place by the next hit; rows of keys never hit again stay. Remove
-- them from cron (pg_cron or any scheduler), as seed 000 suggests:
-- DELETE FROM askdare_counters WHERE reset_at < now();
