//! mysqlStore's tables and procedures, SQL that MySQL 8.0.29+ and MariaDB
//! 10.6+ both run: one procedure per algorithm, each call one short
//! transaction that locks one row (the key's), at READ COMMITTED (no gap
//! locks, whatever the server's default isolation), with the lock wait
//! bounded for that call, on the database's clock (read once the row is
//! locked). A transaction never holds two keys' rows, so instances on shared
//! keys can't deadlock; a key inserted by two sessions at once (1062) or a
//! deadlock InnoDB still reports (1213) rolls back and starts over, nothing
//! applied.
//!
//! A key's row is known by its UTF-8 bytes when they are at most
//! [`RAW_KEY_MAX`] bytes, else by 0xFF and their SHA-256 (0xFF is never in
//! UTF-8, so the two never meet): keys of any length a string holds.

use crate::errors::{Backend, Error, Result};
use crate::window::MAX_SAFE;

use super::codes::COUNT_RANGE_STATE;
use super::config_error;

/// The longest key kept as its own bytes in the `k` column.
pub const RAW_KEY_MAX: usize = 255;
/// The text the procedures signal, with SQLSTATE [`COUNT_RANGE_STATE`], for a count past the safe range.
pub const COUNT_RANGE_TEXT: &str = "ratestore: the count would leave the safe-integer range";

/// The quoted names of a store's tables and procedures.
#[derive(Clone, Debug)]
pub struct MyNames {
    pub table: String,
    pub sliding: String,
    pub bucket: String,
    pub fixed_fn: String,
    pub sliding_fn: String,
    pub bucket_fn: String,
    /// The bare table name, for GET_LOCK.
    pub lock: String,
}

fn quote(name: &str) -> String {
    format!("`{}`", name.replace('`', "``"))
}

impl MyNames {
    pub fn new(table: &str) -> Result<MyNames> {
        // MySQL names are at most 64 characters; the procedures add 6.
        if table.is_empty()
            || table.chars().count() > 58
            || table.contains('\0')
            || table.ends_with(' ')
        {
            return Err(config_error(
                "table must be 1 to 58 characters, with no NUL and not ending in a space (MySQL names are at most \
                 64, and the store adds a suffix of 6)",
            ));
        }
        Ok(MyNames {
            table: quote(table),
            sliding: quote(&format!("{table}_sw")),
            bucket: quote(&format!("{table}_tb")),
            fixed_fn: quote(&format!("{table}_fw_v1")),
            sliding_fn: quote(&format!("{table}_sw_v1")),
            bucket_fn: quote(&format!("{table}_tb_v1")),
            lock: format!("ratestore:{table}"),
        })
    }
}

/// `bytes` as a hex literal: no setting (sql_mode, the connection's
/// character set) changes what it means.
pub fn hex(bytes: &[u8], out: &mut String) {
    const DIGITS: &[u8; 16] = b"0123456789abcdef";
    out.push_str("X'");
    for b in bytes {
        out.push(DIGITS[usize::from(b >> 4)] as char);
        out.push(DIGITS[usize::from(b & 15)] as char);
    }
    out.push('\'');
}

/// The bytes `HEX()` wrote as `text` (either case), or None if it is not
/// hex digits in pairs.
pub fn unhex(text: &str) -> Option<Vec<u8>> {
    let digit = |c: u8| (c as char).to_digit(16).map(|d| d as u8);
    let text = text.as_bytes();
    if !text.len().is_multiple_of(2) {
        return None;
    }
    text.chunks(2)
        .map(|pair| Some(digit(pair[0])? << 4 | digit(pair[1])?))
        .collect()
}

/// The bytes of the `k` column for `key`.
pub fn row_key(key: &str) -> Vec<u8> {
    if key.len() <= RAW_KEY_MAX {
        return key.as_bytes().to_vec();
    }
    let digest = ring::digest::digest(&ring::digest::SHA256, key.as_bytes());
    let mut k = Vec::with_capacity(33);
    k.push(0xff);
    k.extend_from_slice(digest.as_ref());
    k
}

pub fn wrong_shape() -> Error {
    Error::Sql {
        store: Backend::Mysql,
        code: "ERR_MYSQL",
        text: "a procedure of the store answered in the wrong shape (an older or foreign procedure of that name?)"
            .into(),
        sent: Some(true),
    }
}

/// The statements that make the tables and procedures, each its own
/// statement (the store sends them in one query under a GET_LOCK, see
/// [`create_batch`]).
pub fn ddl(n: &MyNames) -> Vec<String> {
    let MyNames {
        table,
        sliding,
        bucket,
        fixed_fn,
        sliding_fn,
        bucket_fn,
        ..
    } = n;
    let max_safe = MAX_SAFE;
    // µs since the epoch on the server's clock, read when the statement runs
    // (within a procedure each statement reads it anew), whatever the time zone.
    let now_us = "TIMESTAMPDIFF(MICROSECOND, '1970-01-01 00:00:00', UTC_TIMESTAMP(6))";
    let big = |e: &str| format!("CAST({e} AS DECIMAL(65,0))");
    let clamp = |e: &str| format!("CAST(LEAST({e}, 9223372036854775807) AS SIGNED)");
    // ceil(count * lft / win), exactly: the previous window's share.
    let weighted = |count: &str| {
        format!(
            "(CASE WHEN v_lft >= v_win THEN {count} ELSE ({} * v_lft + (v_win - 1)) DIV v_win END)",
            big(count)
        )
    };
    let latest = |count: &str, room: &str, most: &str| {
        format!(
            "(CASE WHEN {room} >= {count} THEN {most} ELSE LEAST({most}, ({} * v_win) DIV {count}) END)",
            big(&format!("({room})"))
        )
    };
    let w_prev = weighted("v_prev");
    let latest_prev = latest("v_prev", "p_arg - p_amt - v_cur", "v_lft - 1");
    let latest_cur = latest("v_cur", "p_arg - p_amt", "v_win");
    let range =
        format!("SIGNAL SQLSTATE '{COUNT_RANGE_STATE}' SET MESSAGE_TEXT = '{COUNT_RANGE_TEXT}'");
    // Every procedure: the lock wait bounded (p_lock s) and restored after,
    // READ COMMITTED, one transaction, started over on 1062 or 1213.
    let wrap = |name: &str, params: &str, declare: &str, body: &str| {
        format!(
            r#"CREATE PROCEDURE IF NOT EXISTS {name}({params}, p_lock INT)
MODIFIES SQL DATA SQL SECURITY INVOKER
BEGIN
  DECLARE v_wait BIGINT DEFAULT @@SESSION.innodb_lock_wait_timeout;
  DECLARE v_again INT DEFAULT 0;
  DECLARE v_tries INT DEFAULT 0;
  DECLARE r0 BIGINT DEFAULT 0;
  DECLARE r1 BIGINT DEFAULT 0;
  DECLARE r2 BIGINT DEFAULT 0;
  DECLARE r3 BIGINT DEFAULT 0;
  DECLARE r4 BIGINT DEFAULT 0;
  DECLARE r5 BIGINT DEFAULT 0;
{declare}
  DECLARE EXIT HANDLER FOR SQLEXCEPTION
  BEGIN
    ROLLBACK;
    SET SESSION innodb_lock_wait_timeout = v_wait;
    RESIGNAL;
  END;
  SET SESSION innodb_lock_wait_timeout = p_lock;
  attempt: LOOP
    SET v_again = 0;
    BEGIN
      DECLARE EXIT HANDLER FOR 1062, 1213
      BEGIN
        ROLLBACK;
        SET v_again = 1;
      END;
      SET TRANSACTION ISOLATION LEVEL READ COMMITTED;
      START TRANSACTION;
{body}
      COMMIT;
    END;
    IF v_again = 0 THEN
      LEAVE attempt;
    END IF;
    SET v_tries = v_tries + 1;
    IF v_tries >= 20 THEN
      SIGNAL SQLSTATE '40001' SET MESSAGE_TEXT = 'ratestore: the key''s row was contended 20 times in a row';
    END IF;
  END LOOP;
  SET SESSION innodb_lock_wait_timeout = v_wait;
  SELECT r0, r1, r2, r3, r4, r5;
END"#
        )
    };
    let fixed = wrap(
        fixed_fn,
        "p_op INT, p_k VARBINARY(255), p_win BIGINT, p_amt BIGINT, p_arg BIGINT",
        "  DECLARE v_had BIGINT;\n  DECLARE v_total BIGINT;\n  DECLARE v_reset BIGINT;\n  DECLARE v_now BIGINT;\n  \
         DECLARE v_now_ms BIGINT;\n  DECLARE v_open INT;\n  DECLARE v_cnt BIGINT;\n  DECLARE v_rms BIGINT;\n  \
         DECLARE v_wid BIGINT;\n  DECLARE v_take BIGINT;\n  DECLARE v_end BIGINT;",
        &format!(
            r#"      SELECT COUNT(*), MAX(total), MAX(reset_us) INTO v_had, v_total, v_reset FROM {table} WHERE k = p_k FOR UPDATE;
      SET v_now = {now_us};
      SET v_now_ms = FLOOR(v_now / 1000);
      SET v_open = v_had > 0 AND FLOOR(v_reset / 1000) > v_now_ms;
      IF v_open THEN
        SET v_cnt = v_total, v_rms = FLOOR(v_reset / 1000) - v_now_ms, v_wid = LEAST(v_reset, {max_safe});
      ELSE
        SET v_cnt = 0, v_rms = p_win, v_wid = 0;
      END IF;
      IF p_op = 2 THEN
        IF NOT v_open OR (p_arg <> 0 AND v_wid <> p_arg) THEN
          SET r0 = 0, r1 = 0;
        ELSE
          SET v_take = LEAST(p_amt, GREATEST(v_cnt, 0));
          IF v_take > 0 THEN
            UPDATE {table} SET total = v_cnt - v_take WHERE k = p_k;
          END IF;
          SET r0 = v_cnt - v_take, r1 = v_rms;
        END IF;
      ELSEIF p_op = 0 AND p_amt = 0 THEN
        SET r0 = v_cnt, r1 = v_rms;
      ELSEIF p_op = 1 AND (v_cnt + p_amt > p_arg OR p_amt = 0) THEN
        SET r0 = (v_cnt + p_amt <= p_arg), r1 = v_cnt, r2 = GREATEST(0, LEAST(p_arg, p_arg - v_cnt)), r3 = v_rms, r4 = v_wid;
      ELSE
        IF v_open THEN
          IF ABS(v_cnt + p_amt) > {max_safe} THEN
            {range};
          END IF;
          SET v_cnt = v_cnt + p_amt;
          UPDATE {table} SET total = v_cnt WHERE k = p_k;
        ELSE
          SET v_cnt = p_amt;
          SET v_end = {end};
          SET v_wid = LEAST(v_end, {max_safe});
          IF v_had > 0 THEN
            UPDATE {table} SET total = v_cnt, reset_us = v_end WHERE k = p_k;
          ELSE
            INSERT INTO {table} (k, total, reset_us) VALUES (p_k, v_cnt, v_end);
          END IF;
        END IF;
        IF p_op = 0 THEN
          SET r0 = v_cnt, r1 = v_rms;
        ELSE
          SET r0 = 1, r1 = v_cnt, r2 = GREATEST(0, LEAST(p_arg, p_arg - v_cnt)), r3 = v_rms, r4 = v_wid;
        END IF;
      END IF;"#,
            end = clamp(&format!("{} + {} * 1000", big("v_now"), big("p_win"))),
        ),
    );
    let sliding_expiry = clamp(&format!(
        "{} + (CASE WHEN v_cur > 0 THEN 2 ELSE 1 END) * {}",
        big("v_st"),
        big("v_win")
    ));
    let sliding_proc = wrap(
        sliding_fn,
        "p_op INT, p_k VARBINARY(255), p_win BIGINT, p_amt BIGINT, p_arg BIGINT",
        "  DECLARE v_win BIGINT;\n  DECLARE v_had BIGINT;\n  DECLARE v_sst BIGINT;\n  DECLARE v_sprev BIGINT;\n  \
         DECLARE v_scur BIGINT;\n  DECLARE v_sexp BIGINT;\n  DECLARE v_now BIGINT;\n  DECLARE v_st BIGINT;\n  \
         DECLARE v_lft BIGINT;\n  DECLARE v_prev BIGINT;\n  DECLARE v_cur BIGINT;\n  DECLARE v_est BIGINT;\n  \
         DECLARE v_rms BIGINT;\n  DECLARE v_fcur BIGINT;\n  DECLARE v_fprev BIGINT;\n  DECLARE v_changed INT;\n  \
         DECLARE v_retry BIGINT;",
        &format!(
            r#"      SET v_win = p_win * 1000;
      SELECT COUNT(*), MAX(start_us), MAX(previous), MAX(current), MAX(expires_us)
        INTO v_had, v_sst, v_sprev, v_scur, v_sexp FROM {sliding} WHERE k = p_k FOR UPDATE;
      SET v_now = {now_us};
      SET v_st = v_now - MOD(v_now, v_win);
      SET v_lft = v_win - MOD(v_now, v_win);
      SET v_prev = 0, v_cur = 0, v_fcur = 0, v_fprev = 0, v_changed = 0;
      IF v_had > 0 AND v_sexp > v_now THEN
        IF v_sst >= v_st THEN
          SET v_st = v_sst, v_prev = v_sprev, v_cur = v_scur;
        ELSEIF v_sst + v_win = v_st THEN
          SET v_prev = v_scur;
        END IF;
      END IF;
      SET v_est = {w_prev} + v_cur;
      SET v_rms = (v_lft + 999) DIV 1000;
      IF p_op = 0 THEN
        IF v_est + p_amt > {max_safe} THEN
          {range};
        END IF;
        IF p_amt > 0 THEN
          SET v_cur = v_cur + p_amt, v_changed = 1;
        END IF;
        SET r0 = v_est + p_amt, r1 = v_rms, r2 = v_st + v_win;
      ELSEIF p_op = 1 THEN
        IF p_arg = 0 THEN
          SET v_fcur = LEAST(p_amt, v_cur);
          SET v_fprev = LEAST(p_amt - v_fcur, v_prev);
        ELSEIF p_arg = v_st + v_win THEN
          SET v_fcur = LEAST(p_amt, v_cur);
        ELSEIF p_arg = v_st THEN
          SET v_fprev = LEAST(p_amt, v_prev);
        END IF;
        IF v_fcur + v_fprev > 0 THEN
          SET v_cur = v_cur - v_fcur, v_prev = v_prev - v_fprev, v_changed = 1;
        END IF;
        SET r0 = {w_prev} + v_cur, r1 = v_rms, r2 = v_st + v_win;
      ELSEIF v_est + p_amt <= p_arg THEN
        IF p_amt > 0 THEN
          SET v_cur = v_cur + p_amt, v_changed = 1;
        END IF;
        SET v_est = v_est + p_amt;
        SET r0 = 1, r1 = v_est, r2 = GREATEST(0, LEAST(p_arg, p_arg - v_est)), r3 = v_rms, r4 = 0, r5 = v_st + v_win;
      ELSE
        IF p_amt > p_arg THEN
          SET v_retry = CASE WHEN v_cur > 0 THEN (v_lft + v_win + 999) DIV 1000 ELSE v_rms END;
        ELSEIF v_cur + p_amt <= p_arg THEN
          SET v_retry = (v_lft - {latest_prev} + 999) DIV 1000;
        ELSE
          SET v_retry = ({big_lft} + v_win - {latest_cur} + 999) DIV 1000;
        END IF;
        SET r0 = 0, r1 = v_est, r2 = GREATEST(0, LEAST(p_arg, p_arg - v_est)), r3 = v_rms, r4 = v_retry, r5 = v_st + v_win;
      END IF;
      IF v_changed THEN
        IF v_prev = 0 AND v_cur = 0 THEN
          DELETE FROM {sliding} WHERE k = p_k;
        ELSEIF v_had > 0 THEN
          UPDATE {sliding} SET start_us = v_st, previous = v_prev, current = v_cur,
            expires_us = {sliding_expiry} WHERE k = p_k;
        ELSE
          INSERT INTO {sliding} (k, start_us, previous, current, expires_us)
            VALUES (p_k, v_st, v_prev, v_cur, {sliding_expiry});
        END IF;
      END IF;"#,
            big_lft = big("v_lft"),
        ),
    );
    // ceil(max(want - have, 0) / refill) refills after v_at, in µs (exact, clamped).
    let holds_at = |have: &str, want: &str| {
        clamp(&format!(
            "{} + ((GREATEST({want} - {have}, 0) + p_refill - 1) DIV p_refill) * {}",
            big("v_at"),
            big("v_iv")
        ))
    };
    let ms_until =
        |t: &str| format!("(CASE WHEN {t} <= v_now THEN 0 ELSE ({t} - v_now + 999) DIV 1000 END)");
    let bucket_proc = wrap(
        bucket_fn,
        "p_k VARBINARY(255), p_cap BIGINT, p_refill BIGINT, p_ims BIGINT, p_cost BIGINT",
        "  DECLARE v_iv BIGINT;\n  DECLARE v_had BIGINT;\n  DECLARE v_stok BIGINT;\n  DECLARE v_sat BIGINT;\n  \
         DECLARE v_sexp BIGINT;\n  DECLARE v_now BIGINT;\n  DECLARE v_tokens BIGINT;\n  DECLARE v_at BIGINT;\n  \
         DECLARE v_missing BIGINT;\n  DECLARE v_refills BIGINT;\n  DECLARE v_rem BIGINT;\n  DECLARE v_ends BIGINT;\n  \
         DECLARE v_rms BIGINT;\n  DECLARE v_retry BIGINT;",
        &format!(
            r#"      SET v_iv = p_ims * 1000;
      SELECT COUNT(*), MAX(tokens), MAX(at_us), MAX(expires_us) INTO v_had, v_stok, v_sat, v_sexp
        FROM {bucket} WHERE k = p_k FOR UPDATE;
      SET v_now = {now_us};
      SET v_tokens = p_cap, v_at = v_now;
      IF v_had > 0 AND v_sexp > v_now THEN
        SET v_missing = p_cap - v_stok;
        IF v_missing > 0 THEN
          SET v_refills = CASE WHEN v_now > v_sat THEN (v_now - v_sat) DIV v_iv ELSE 0 END;
          IF v_refills < (v_missing + p_refill - 1) DIV p_refill THEN
            SET v_tokens = v_stok + v_refills * p_refill;
            SET v_at = v_sat + v_refills * v_iv;
          END IF;
        END IF;
      END IF;
      IF p_cost <= v_tokens THEN
        SET v_rem = v_tokens - p_cost;
        SET v_ends = {holds_rem};
        IF p_cost > 0 THEN
          IF v_had > 0 THEN
            UPDATE {bucket} SET tokens = v_rem, at_us = v_at, expires_us = v_ends WHERE k = p_k;
          ELSE
            INSERT INTO {bucket} (k, tokens, at_us, expires_us) VALUES (p_k, v_rem, v_at, v_ends);
          END IF;
        END IF;
        SET r0 = 1, r1 = v_rem, r2 = 0, r3 = {until_ends};
      ELSE
        SET v_ends = {holds_tokens};
        SET v_rms = {until_ends};
        IF p_cost > p_cap THEN
          SET v_retry = GREATEST(v_rms, 1);
        ELSE
          SET v_ends = {holds_cost};
          SET v_retry = {until_ends};
        END IF;
        SET r0 = 0, r1 = v_tokens, r2 = v_retry, r3 = v_rms;
      END IF;"#,
            holds_rem = holds_at("v_rem", "p_cap"),
            holds_tokens = holds_at("v_tokens", "p_cap"),
            holds_cost = holds_at("v_tokens", "p_cost"),
            until_ends = ms_until("v_ends"),
        ),
    );
    vec![
        format!(
            "CREATE TABLE IF NOT EXISTS {table} (\n  \
             k        VARBINARY(255) NOT NULL PRIMARY KEY,\n  \
             total    BIGINT NOT NULL,\n  \
             reset_us BIGINT NOT NULL,\n  \
             KEY reset_us (reset_us)\n) ENGINE=InnoDB"
        ),
        format!(
            "CREATE TABLE IF NOT EXISTS {sliding} (\n  \
             k          VARBINARY(255) NOT NULL PRIMARY KEY,\n  \
             start_us   BIGINT NOT NULL,\n  \
             previous   BIGINT NOT NULL,\n  \
             current    BIGINT NOT NULL,\n  \
             expires_us BIGINT NOT NULL,\n  \
             KEY expires_us (expires_us)\n) ENGINE=InnoDB"
        ),
        format!(
            "CREATE TABLE IF NOT EXISTS {bucket} (\n  \
             k          VARBINARY(255) NOT NULL PRIMARY KEY,\n  \
             tokens     BIGINT NOT NULL,\n  \
             at_us      BIGINT NOT NULL,\n  \
             expires_us BIGINT NOT NULL,\n  \
             KEY expires_us (expires_us)\n) ENGINE=InnoDB"
        ),
        fixed,
        sliding_proc,
        bucket_proc,
    ]
}

/// [`ddl`] as one query, under GET_LOCK on the table's name so that
/// instances starting together create everything one at a time; the lock
/// is released in the same query (nothing stays on the session).
pub fn create_batch(n: &MyNames) -> (String, usize) {
    let mut lock = String::new();
    hex(n.lock.as_bytes(), &mut lock);
    let statements = ddl(n);
    let count = statements.len() + 2;
    (
        format!(
            "DO GET_LOCK({lock}, 30);\n{};\nDO RELEASE_LOCK({lock})",
            statements.join(";\n")
        ),
        count,
    )
}

/// docs/mysql.sql's text for `n`: the statements, for a client that reads `DELIMITER`.
pub fn documented(n: &MyNames) -> String {
    let mut out = String::new();
    for s in ddl(n) {
        if s.starts_with("CREATE PROCEDURE") {
            out.push_str(&format!("DELIMITER //\n{s}//\nDELIMITER ;\n\n"));
        } else {
            out.push_str(&format!("{s};\n\n"));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_quoted_and_derived() {
        let n = MyNames::new("we`ird").unwrap();
        assert_eq!(n.table, "`we``ird`");
        assert_eq!(n.bucket_fn, "`we``ird_tb_v1`");
        assert!(MyNames::new(&"a".repeat(58)).is_ok());
        assert!(MyNames::new(&"a".repeat(59)).is_err());
        assert!(MyNames::new("").is_err());
        assert!(MyNames::new("t\0").is_err());
    }

    #[test]
    fn hex_reads_back_what_it_wrote() {
        let bytes = [0x00, 0x0f, 0xa5, 0xff, b'k'];
        let mut literal = String::new();
        hex(&bytes, &mut literal);
        assert_eq!(literal, "X'000fa5ff6b'");
        assert_eq!(
            unhex(&literal[2..literal.len() - 1]).as_deref(),
            Some(&bytes[..])
        );
        assert_eq!(unhex("000FA5FF6B").as_deref(), Some(&bytes[..]));
        assert_eq!((unhex("0"), unhex("zz")), (None, None));
    }

    #[test]
    fn long_keys_are_hashed_apart_from_short_ones() {
        assert_eq!(row_key("abc"), b"abc");
        let long = "x".repeat(RAW_KEY_MAX + 1);
        let k = row_key(&long);
        assert_eq!((k.len(), k[0]), (33, 0xff));
        assert_ne!(row_key(&"x".repeat(RAW_KEY_MAX + 2)), k);
        let mut s = String::new();
        hex(b"a'\\", &mut s);
        assert_eq!(s, "X'61275c'");
    }

    #[test]
    fn the_documented_sql_is_the_store_s() {
        let doc = include_str!("../../docs/mysql.sql");
        let text = documented(&MyNames::new(super::super::DEFAULT_TABLE).unwrap());
        assert!(
            doc.contains(&text),
            "docs/mysql.sql must hold documented() for the default names verbatim"
        );
    }
}
