//! The server error numbers mysqlStore acts on, by name (MySQL's and
//! MariaDB's `ER_*`; both servers use these numbers).

/// The SQLSTATE the procedures signal for a count past the safe range
/// (`numeric value out of range`), with [`super::schema::COUNT_RANGE_TEXT`].
pub const COUNT_RANGE_STATE: &str = "22003";

/// `ER_DBACCESS_DENIED_ERROR`: the user may not use the database.
pub const DB_ACCESS_DENIED: u16 = 1044;
/// `ER_ACCESS_DENIED_ERROR`: a wrong user or password.
pub const ACCESS_DENIED: u16 = 1045;
/// `ER_DUP_ENTRY`: two sessions inserted one key's row at once.
pub const DUP_ENTRY: u16 = 1062;
/// `ER_PARSE_ERROR`: its message quotes the statement.
pub const PARSE_ERROR: u16 = 1064;
/// `ER_NO_SUCH_TABLE`.
pub const NO_SUCH_TABLE: u16 = 1146;
/// `ER_SYNTAX_ERROR`: its message quotes the statement.
pub const SYNTAX_ERROR: u16 = 1149;
/// `ER_LOCK_WAIT_TIMEOUT`: a row stayed locked past the lock wait.
pub const LOCK_WAIT_TIMEOUT: u16 = 1205;
/// `ER_LOCK_DEADLOCK` (SQLSTATE 40001): the transaction was rolled back.
pub const LOCK_DEADLOCK: u16 = 1213;
/// `ER_OPTION_PREVENTS_STATEMENT`: `read_only` (a replica, or a primary demoted).
pub const READ_ONLY: u16 = 1290;
/// `ER_SP_DOES_NOT_EXIST`: the store's procedure is missing.
pub const NO_SUCH_PROCEDURE: u16 = 1305;
/// `ER_QUERY_INTERRUPTED`: KILL QUERY, or `max_statement_time`.
pub const QUERY_INTERRUPTED: u16 = 1317;
/// `ER_PROCACCESS_DENIED_ERROR`: the user lacks EXECUTE.
pub const NO_EXECUTE: u16 = 1370;
/// `ER_ACCESS_DENIED_NO_PASSWORD_ERROR`.
pub const ACCESS_DENIED_NO_PASSWORD: u16 = 1698;
/// `ER_READ_ONLY_MODE`: the server is read-only.
pub const READ_ONLY_MODE: u16 = 1836;
