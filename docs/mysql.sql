-- mysqlStore's tables and procedures, for `createTable: false` (MySQL 8.0.29+, MariaDB 10.6+).
-- Run as a user that may create tables and routines in the database, e.g.:
--   mysql -h HOST -u USER -p DATABASE < docs/mysql.sql
-- These are the statements the store runs itself with createTable on, for the default table name
-- askdare_counters (another name: replace askdare_counters throughout). The store's database user then
-- needs SELECT, INSERT, UPDATE and DELETE on the three tables and EXECUTE on the three procedures.
--
-- k is a key's UTF-8 bytes when they are at most 255 bytes, else 0xFF followed by their SHA-256.
-- Times are µs since the epoch on the database's clock (UTC_TIMESTAMP(6)).
-- Expired rows (reset_us / expires_us in the past) count nothing; the store deletes them in batches
-- every sweepIntervalMs; with sweepIntervalMs: 0, delete them from cron, e.g.
--   DELETE FROM askdare_counters WHERE reset_us < TIMESTAMPDIFF(MICROSECOND, '1970-01-01', UTC_TIMESTAMP(6)) LIMIT 500;

CREATE TABLE IF NOT EXISTS `askdare_counters` (
  k        VARBINARY(255) NOT NULL PRIMARY KEY,
  total    BIGINT NOT NULL,
  reset_us BIGINT NOT NULL,
  KEY reset_us (reset_us)
) ENGINE=InnoDB;

CREATE TABLE IF NOT EXISTS `askdare_counters_sw` (
  k          VARBINARY(255) NOT NULL PRIMARY KEY,
  start_us   BIGINT NOT NULL,
  previous   BIGINT NOT NULL,
  current    BIGINT NOT NULL,
  expires_us BIGINT NOT NULL,
  KEY expires_us (expires_us)
) ENGINE=InnoDB;

CREATE TABLE IF NOT EXISTS `askdare_counters_tb` (
  k          VARBINARY(255) NOT NULL PRIMARY KEY,
  tokens     BIGINT NOT NULL,
  at_us      BIGINT NOT NULL,
  expires_us BIGINT NOT NULL,
  KEY expires_us (expires_us)
) ENGINE=InnoDB;

DELIMITER //
CREATE PROCEDURE IF NOT EXISTS `askdare_counters_fw_v1`(p_op INT, p_k VARBINARY(255), p_win BIGINT, p_amt BIGINT, p_arg BIGINT, p_lock INT)
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
  DECLARE v_had BIGINT;
  DECLARE v_total BIGINT;
  DECLARE v_reset BIGINT;
  DECLARE v_now BIGINT;
  DECLARE v_now_ms BIGINT;
  DECLARE v_open INT;
  DECLARE v_cnt BIGINT;
  DECLARE v_rms BIGINT;
  DECLARE v_wid BIGINT;
  DECLARE v_take BIGINT;
  DECLARE v_end BIGINT;
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
      SELECT COUNT(*), MAX(total), MAX(reset_us) INTO v_had, v_total, v_reset FROM `askdare_counters` WHERE k = p_k FOR UPDATE;
      SET v_now = TIMESTAMPDIFF(MICROSECOND, '1970-01-01 00:00:00', UTC_TIMESTAMP(6));
      SET v_now_ms = FLOOR(v_now / 1000);
      SET v_open = v_had > 0 AND FLOOR(v_reset / 1000) > v_now_ms;
      IF v_open THEN
        SET v_cnt = v_total, v_rms = FLOOR(v_reset / 1000) - v_now_ms, v_wid = LEAST(v_reset, 9007199254740991);
      ELSE
        SET v_cnt = 0, v_rms = p_win, v_wid = 0;
      END IF;
      IF p_op = 2 THEN
        IF NOT v_open OR (p_arg <> 0 AND v_wid <> p_arg) THEN
          SET r0 = 0, r1 = 0;
        ELSE
          SET v_take = LEAST(p_amt, GREATEST(v_cnt, 0));
          IF v_take > 0 THEN
            UPDATE `askdare_counters` SET total = v_cnt - v_take WHERE k = p_k;
          END IF;
          SET r0 = v_cnt - v_take, r1 = v_rms;
        END IF;
      ELSEIF p_op = 0 AND p_amt = 0 THEN
        SET r0 = v_cnt, r1 = v_rms;
      ELSEIF p_op = 1 AND (v_cnt + p_amt > p_arg OR p_amt = 0) THEN
        SET r0 = (v_cnt + p_amt <= p_arg), r1 = v_cnt, r2 = GREATEST(0, LEAST(p_arg, p_arg - v_cnt)), r3 = v_rms, r4 = v_wid;
      ELSE
        IF v_open THEN
          IF ABS(v_cnt + p_amt) > 9007199254740991 THEN
            SIGNAL SQLSTATE '22003' SET MESSAGE_TEXT = 'ratestore: the count would leave the safe-integer range';
          END IF;
          SET v_cnt = v_cnt + p_amt;
          UPDATE `askdare_counters` SET total = v_cnt WHERE k = p_k;
        ELSE
          SET v_cnt = p_amt;
          SET v_end = CAST(LEAST(CAST(v_now AS DECIMAL(65,0)) + CAST(p_win AS DECIMAL(65,0)) * 1000, 9223372036854775807) AS SIGNED);
          SET v_wid = LEAST(v_end, 9007199254740991);
          IF v_had > 0 THEN
            UPDATE `askdare_counters` SET total = v_cnt, reset_us = v_end WHERE k = p_k;
          ELSE
            INSERT INTO `askdare_counters` (k, total, reset_us) VALUES (p_k, v_cnt, v_end);
          END IF;
        END IF;
        IF p_op = 0 THEN
          SET r0 = v_cnt, r1 = v_rms;
        ELSE
          SET r0 = 1, r1 = v_cnt, r2 = GREATEST(0, LEAST(p_arg, p_arg - v_cnt)), r3 = v_rms, r4 = v_wid;
        END IF;
      END IF;
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
END//
DELIMITER ;

DELIMITER //
CREATE PROCEDURE IF NOT EXISTS `askdare_counters_sw_v1`(p_op INT, p_k VARBINARY(255), p_win BIGINT, p_amt BIGINT, p_arg BIGINT, p_lock INT)
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
  DECLARE v_win BIGINT;
  DECLARE v_had BIGINT;
  DECLARE v_sst BIGINT;
  DECLARE v_sprev BIGINT;
  DECLARE v_scur BIGINT;
  DECLARE v_sexp BIGINT;
  DECLARE v_now BIGINT;
  DECLARE v_st BIGINT;
  DECLARE v_lft BIGINT;
  DECLARE v_prev BIGINT;
  DECLARE v_cur BIGINT;
  DECLARE v_est BIGINT;
  DECLARE v_rms BIGINT;
  DECLARE v_fcur BIGINT;
  DECLARE v_fprev BIGINT;
  DECLARE v_changed INT;
  DECLARE v_retry BIGINT;
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
      SET v_win = p_win * 1000;
      SELECT COUNT(*), MAX(start_us), MAX(previous), MAX(current), MAX(expires_us)
        INTO v_had, v_sst, v_sprev, v_scur, v_sexp FROM `askdare_counters_sw` WHERE k = p_k FOR UPDATE;
      SET v_now = TIMESTAMPDIFF(MICROSECOND, '1970-01-01 00:00:00', UTC_TIMESTAMP(6));
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
      SET v_est = (CASE WHEN v_lft >= v_win THEN v_prev ELSE (CAST(v_prev AS DECIMAL(65,0)) * v_lft + (v_win - 1)) DIV v_win END) + v_cur;
      SET v_rms = (v_lft + 999) DIV 1000;
      IF p_op = 0 THEN
        IF v_est + p_amt > 9007199254740991 THEN
          SIGNAL SQLSTATE '22003' SET MESSAGE_TEXT = 'ratestore: the count would leave the safe-integer range';
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
        SET r0 = (CASE WHEN v_lft >= v_win THEN v_prev ELSE (CAST(v_prev AS DECIMAL(65,0)) * v_lft + (v_win - 1)) DIV v_win END) + v_cur, r1 = v_rms, r2 = v_st + v_win;
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
          SET v_retry = (v_lft - (CASE WHEN p_arg - p_amt - v_cur >= v_prev THEN v_lft - 1 ELSE LEAST(v_lft - 1, (CAST((p_arg - p_amt - v_cur) AS DECIMAL(65,0)) * v_win) DIV v_prev) END) + 999) DIV 1000;
        ELSE
          SET v_retry = (CAST(v_lft AS DECIMAL(65,0)) + v_win - (CASE WHEN p_arg - p_amt >= v_cur THEN v_win ELSE LEAST(v_win, (CAST((p_arg - p_amt) AS DECIMAL(65,0)) * v_win) DIV v_cur) END) + 999) DIV 1000;
        END IF;
        SET r0 = 0, r1 = v_est, r2 = GREATEST(0, LEAST(p_arg, p_arg - v_est)), r3 = v_rms, r4 = v_retry, r5 = v_st + v_win;
      END IF;
      IF v_changed THEN
        IF v_prev = 0 AND v_cur = 0 THEN
          DELETE FROM `askdare_counters_sw` WHERE k = p_k;
        ELSEIF v_had > 0 THEN
          UPDATE `askdare_counters_sw` SET start_us = v_st, previous = v_prev, current = v_cur,
            expires_us = CAST(LEAST(CAST(v_st AS DECIMAL(65,0)) + (CASE WHEN v_cur > 0 THEN 2 ELSE 1 END) * CAST(v_win AS DECIMAL(65,0)), 9223372036854775807) AS SIGNED) WHERE k = p_k;
        ELSE
          INSERT INTO `askdare_counters_sw` (k, start_us, previous, current, expires_us)
            VALUES (p_k, v_st, v_prev, v_cur, CAST(LEAST(CAST(v_st AS DECIMAL(65,0)) + (CASE WHEN v_cur > 0 THEN 2 ELSE 1 END) * CAST(v_win AS DECIMAL(65,0)), 9223372036854775807) AS SIGNED));
        END IF;
      END IF;
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
END//
DELIMITER ;

DELIMITER //
CREATE PROCEDURE IF NOT EXISTS `askdare_counters_tb_v1`(p_k VARBINARY(255), p_cap BIGINT, p_refill BIGINT, p_ims BIGINT, p_cost BIGINT, p_lock INT)
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
  DECLARE v_iv BIGINT;
  DECLARE v_had BIGINT;
  DECLARE v_stok BIGINT;
  DECLARE v_sat BIGINT;
  DECLARE v_sexp BIGINT;
  DECLARE v_now BIGINT;
  DECLARE v_tokens BIGINT;
  DECLARE v_at BIGINT;
  DECLARE v_missing BIGINT;
  DECLARE v_refills BIGINT;
  DECLARE v_rem BIGINT;
  DECLARE v_ends BIGINT;
  DECLARE v_rms BIGINT;
  DECLARE v_retry BIGINT;
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
      SET v_iv = p_ims * 1000;
      SELECT COUNT(*), MAX(tokens), MAX(at_us), MAX(expires_us) INTO v_had, v_stok, v_sat, v_sexp
        FROM `askdare_counters_tb` WHERE k = p_k FOR UPDATE;
      SET v_now = TIMESTAMPDIFF(MICROSECOND, '1970-01-01 00:00:00', UTC_TIMESTAMP(6));
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
        SET v_ends = CAST(LEAST(CAST(v_at AS DECIMAL(65,0)) + ((GREATEST(p_cap - v_rem, 0) + p_refill - 1) DIV p_refill) * CAST(v_iv AS DECIMAL(65,0)), 9223372036854775807) AS SIGNED);
        IF p_cost > 0 THEN
          IF v_had > 0 THEN
            UPDATE `askdare_counters_tb` SET tokens = v_rem, at_us = v_at, expires_us = v_ends WHERE k = p_k;
          ELSE
            INSERT INTO `askdare_counters_tb` (k, tokens, at_us, expires_us) VALUES (p_k, v_rem, v_at, v_ends);
          END IF;
        END IF;
        SET r0 = 1, r1 = v_rem, r2 = 0, r3 = (CASE WHEN v_ends <= v_now THEN 0 ELSE (v_ends - v_now + 999) DIV 1000 END);
      ELSE
        SET v_ends = CAST(LEAST(CAST(v_at AS DECIMAL(65,0)) + ((GREATEST(p_cap - v_tokens, 0) + p_refill - 1) DIV p_refill) * CAST(v_iv AS DECIMAL(65,0)), 9223372036854775807) AS SIGNED);
        SET v_rms = (CASE WHEN v_ends <= v_now THEN 0 ELSE (v_ends - v_now + 999) DIV 1000 END);
        IF p_cost > p_cap THEN
          SET v_retry = GREATEST(v_rms, 1);
        ELSE
          SET v_ends = CAST(LEAST(CAST(v_at AS DECIMAL(65,0)) + ((GREATEST(p_cost - v_tokens, 0) + p_refill - 1) DIV p_refill) * CAST(v_iv AS DECIMAL(65,0)), 9223372036854775807) AS SIGNED);
          SET v_retry = (CASE WHEN v_ends <= v_now THEN 0 ELSE (v_ends - v_now + 999) DIV 1000 END);
        END IF;
        SET r0 = 0, r1 = v_tokens, r2 = v_retry, r3 = v_rms;
      END IF;
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
END//
DELIMITER ;

