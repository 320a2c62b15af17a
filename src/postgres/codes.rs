//! The SQLSTATEs postgresStore acts on, by name (PostgreSQL's "Appendix A.
//! PostgreSQL Error Codes"), and the rules that group them: one place for
//! what each means to the store.

/// The store's own SQLSTATE: its functions raise it for a count past
/// ±(2^53 - 1).
pub const COUNT_RANGE: &str = "RS001";

/// `division_by_zero`: a step's check statement divides by zero on purpose
/// when a take is refused, which rolls the step's transaction back.
pub const DIVISION_BY_ZERO: &str = "22012";

/// `cardinality_violation`: one upsert met one row twice (a key column
/// under which two of a batch's keys are equal, as `citext` makes them).
pub const CARDINALITY_VIOLATION: &str = "21000";

/// `invalid_text_representation`: with the store's own mark in its
/// message, a count past 2^53 the store's functions refuse.
pub const INVALID_TEXT_REPRESENTATION: &str = "22P02";
/// `read_only_sql_transaction`: a server that can't write (a standby, a
/// primary demoted by a failover).
pub const READ_ONLY_SQL_TRANSACTION: &str = "25006";
/// `invalid_sql_statement_name`: a prepared statement the session does not
/// have, as behind a transaction pooler.
pub const INVALID_SQL_STATEMENT_NAME: &str = "26000";
/// `invalid_authorization_specification`: a login refused (no such role,
/// pg_hba.conf).
pub const INVALID_AUTHORIZATION_SPECIFICATION: &str = "28000";
/// `invalid_password`.
pub const INVALID_PASSWORD: &str = "28P01";
/// `serialization_failure`: under `repeatable read` or `serializable`, the
/// transaction was rolled back.
pub const SERIALIZATION_FAILURE: &str = "40001";
/// `deadlock_detected`: the transaction was rolled back.
pub const DEADLOCK_DETECTED: &str = "40P01";
/// `undefined_function`: the store's function is missing.
pub const UNDEFINED_FUNCTION: &str = "42883";
/// `undefined_table`: the store's table is missing.
pub const UNDEFINED_TABLE: &str = "42P01";
/// `lock_not_available`: a row stayed locked past the statement's
/// `lock_timeout`.
pub const LOCK_NOT_AVAILABLE: &str = "55P03";
/// `query_canceled`: `statement_timeout`, or the store's cancel request.
pub const QUERY_CANCELED: &str = "57014";
/// `admin_shutdown`: `pg_terminate_backend`, or a shutdown.
pub const ADMIN_SHUTDOWN: &str = "57P01";
/// `crash_shutdown`: another backend crashed.
pub const CRASH_SHUTDOWN: &str = "57P02";
/// `cannot_connect_now`: the server is starting up or shutting down.
pub const CANNOT_CONNECT_NOW: &str = "57P03";
/// Class 08, connection exceptions.
const CONNECTION_EXCEPTION_CLASS: &str = "08";
/// Class 22, data exceptions.
const DATA_EXCEPTION_CLASS: &str = "22";

/// Whether the server rolled the whole transaction back for a reason that
/// another try may not meet (a deadlock, a serialization failure): nothing
/// of it was applied.
pub fn retryable(state: &str) -> bool {
    matches!(state, DEADLOCK_DETECTED | SERIALIZATION_FAILURE)
}

/// Whether a login was refused.
pub fn auth(state: &str) -> bool {
    matches!(
        state,
        INVALID_PASSWORD | INVALID_AUTHORIZATION_SPECIFICATION
    )
}

/// Whether the session is gone: the server ended it, is not taking
/// connections, or a connection exception (class 08).
pub fn connection_lost(state: &str) -> bool {
    matches!(state, ADMIN_SHUTDOWN | CRASH_SHUTDOWN | CANNOT_CONNECT_NOW)
        || state.starts_with(CONNECTION_EXCEPTION_CLASS)
}

/// Whether the error is a data exception (class 22): the call's own input.
pub fn data_exception(state: &str) -> bool {
    state.starts_with(DATA_EXCEPTION_CLASS)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn groups_the_states_the_store_acts_on() {
        assert!(retryable("40P01") && retryable("40001"));
        assert!(!retryable("55P03") && !retryable("57014"));
        assert!(auth("28P01") && auth("28000") && !auth("28001"));
        for lost in ["57P01", "57P02", "57P03", "08006", "08001", "08P01"] {
            assert!(connection_lost(lost), "{lost}");
        }
        assert!(!connection_lost("57014") && !connection_lost("25006"));
        assert!(data_exception("22012") && data_exception("22P02") && !data_exception("23505"));
    }
}
