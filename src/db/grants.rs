//! The grants a command needs, checked at start: a role that lacks one fails before anything is
//! consumed, with one line naming the table and the privilege, instead of a partition that
//! stalls on the first batch.
//!
//! `PREPARE` checks no privileges, so each of the command's statements is run, on empty input
//! (every array parameter empty, a JSON one `[]`, every other one NULL), inside one transaction that is rolled
//! back, each in a savepoint of its own. PostgreSQL checks a statement's privileges before it
//! touches any row: a statement that fails for another reason (a NULL in a NOT NULL column)
//! had its privileges, and one that fails with `insufficient_privilege` (42501) did not; which
//! one it lacked is read from `has_table_privilege`, for the privileges the statement needs.
//! A table that does not exist passes here: the schema check names the `migrate` that creates
//! it.

use deadpool_postgres::{GenericClient, Pool};
use tokio_postgres::error::SqlState;
use tokio_postgres::types::{to_sql_checked, IsNull, Kind, ToSql, Type};

use super::error::DbError;
use crate::db::sql;

/// What a command does with the database: each set of statements it runs, whose grants
/// [`check_grants`] checks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum Uses {
    /// Reads the schema's versions (`schema_migrations`): every command but `migrate`.
    SchemaVersions,
    /// Inserts ids into the inbox and writes dead letters: `run`.
    Inbox,
    /// Reads and upserts the partitions' next offsets (`consumer_offsets`) and the topic ids they
    /// belong to (`consumer_topics`): `run` with offsets in the database.
    OffsetsInDb,
    /// Deletes expired inbox rows (a plain inbox, or a partitioned one's default partition):
    /// `cleanup`, `run --retention`.
    Retention,
    /// Reads the dead letters: `dead-letters list`.
    ReadDeadLetters,
    /// Re-drives dead letters: locks and marks them, inserts into the inbox and deletes the
    /// inbox rows dead letters put there (`dead-letters redrive`; the handler's own grants
    /// apart).
    Redrive,
    /// The ledger's statements on `balances`.
    Ledger,
    /// Creates, attaches and drops the inbox's daily partitions, when it is partitioned: the
    /// inbox's owner's (or a member of the owning role's) alone. Nothing with a plain inbox.
    /// `run` and `cleanup`.
    PartitionUpkeep,
}

/// One statement and the table privileges it needs.
struct Check {
    sql: &'static str,
    needs: &'static [(&'static str, &'static str)],
}

const SCHEMA_VERSIONS: &[Check] = &[Check {
    sql: "SELECT coalesce(max(version), 0) FROM schema_migrations WHERE owner = $1",
    needs: &[("schema_migrations", "SELECT")],
}];

const INBOX: &[Check] = &[
    Check {
        sql: sql::INSERT_IDS,
        needs: &[("inbox", "SELECT"), ("inbox", "INSERT")],
    },
    Check {
        sql: sql::INSERT_DEAD_LETTERS,
        needs: &[("dead_letters", "SELECT"), ("dead_letters", "INSERT")],
    },
];

const OFFSETS_IN_DB: &[Check] = &[
    Check {
        sql: sql::READ_OFFSETS,
        needs: &[("consumer_offsets", "SELECT")],
    },
    Check {
        sql: sql::UPSERT_OFFSET,
        needs: &[
            ("consumer_offsets", "SELECT"),
            ("consumer_offsets", "INSERT"),
            ("consumer_offsets", "UPDATE"),
        ],
    },
    Check {
        sql: sql::READ_TOPIC_IDS,
        needs: &[
            ("consumer_topics", "SELECT"),
            ("consumer_offsets", "SELECT"),
        ],
    },
    Check {
        sql: sql::RECORD_TOPIC_ID,
        needs: &[
            ("consumer_topics", "SELECT"),
            ("consumer_topics", "INSERT"),
            ("consumer_topics", "UPDATE"),
        ],
    },
];

const RETENTION: &[Check] = &[Check {
    sql: "DELETE FROM inbox WHERE ctid = ANY(ARRAY(
              SELECT ctid FROM inbox WHERE processed_at < $1 LIMIT $2 FOR UPDATE SKIP LOCKED))",
    needs: &[
        ("inbox", "SELECT"),
        ("inbox", "UPDATE"),
        ("inbox", "DELETE"),
    ],
}];

const READ_DEAD_LETTERS: &[Check] = &[Check {
    sql: sql::redrive::LIST,
    needs: &[("dead_letters", "SELECT")],
}];

const REDRIVE: &[Check] = &[
    Check {
        sql: sql::redrive::LOCK_PARKED,
        needs: &[("dead_letters", "SELECT"), ("dead_letters", "UPDATE")],
    },
    Check {
        sql: sql::redrive::MARK,
        needs: &[("dead_letters", "SELECT"), ("dead_letters", "UPDATE")],
    },
    Check {
        sql: sql::INSERT_IDS,
        needs: &[("inbox", "SELECT"), ("inbox", "INSERT")],
    },
    Check {
        sql: sql::redrive::DELETE_OWN_INBOX_ROWS,
        needs: &[("inbox", "SELECT"), ("inbox", "DELETE")],
    },
];

const LEDGER: &[Check] = &[
    Check {
        sql: sql::ledger::READ_ONE,
        needs: &[("balances", "SELECT")],
    },
    Check {
        sql: sql::ledger::ENSURE_ACCOUNTS,
        needs: &[("balances", "INSERT")],
    },
    Check {
        sql: sql::ledger::LOCK_ACCOUNTS_NOWAIT,
        needs: &[("balances", "SELECT"), ("balances", "UPDATE")],
    },
    Check {
        sql: sql::ledger::GUARDED_UPDATE,
        needs: &[("balances", "SELECT"), ("balances", "UPDATE")],
    },
];

impl Uses {
    fn checks(self) -> &'static [Check] {
        match self {
            Uses::SchemaVersions => SCHEMA_VERSIONS,
            Uses::Inbox => INBOX,
            Uses::OffsetsInDb => OFFSETS_IN_DB,
            Uses::Retention => RETENTION,
            Uses::ReadDeadLetters => READ_DEAD_LETTERS,
            Uses::Redrive => REDRIVE,
            Uses::Ledger => LEDGER,
            Uses::PartitionUpkeep => &[],
        }
    }
}

/// Fails with [`DbError::Grant`] (or [`DbError::Denied`]) when the role of `pool` lacks a
/// privilege that `command` (its name, for the message) needs for what it `uses`; changes
/// nothing (see the module documentation).
pub async fn check_grants(pool: &Pool, command: &str, uses: &[Uses]) -> Result<(), DbError> {
    let mut client = pool.get().await?;
    let tx = client.transaction().await?;
    for check in uses.iter().flat_map(|u| u.checks()) {
        if let Some(denied) = run_one(&tx, check.sql).await? {
            return Err(diagnose(&tx, command, check.needs, "its statements", &denied).await?);
        }
    }
    if uses.contains(&Uses::PartitionUpkeep) {
        check_owner(&tx, command).await?;
    }
    Ok(()) // the transaction rolls back on drop
}

/// Fails with [`DbError::Denied`] when the inbox is partitioned and the role is neither its
/// owner nor a member of the owning role: only they may create, attach and drop partitions.
async fn check_owner(tx: &impl GenericClient, command: &str) -> Result<(), DbError> {
    let row = tx
        .query_opt(
            "SELECT current_user::text, pg_get_userbyid(c.relowner)::text,
                    pg_has_role(c.relowner, 'USAGE')
             FROM pg_class c WHERE c.oid = to_regclass('inbox') AND c.relkind = 'p'",
            &[],
        )
        .await?;
    match row {
        Some(row) if !row.get::<_, bool>(2) => Err(DbError::Denied {
            role: row.get(0),
            what: "the partitioned inbox's upkeep (creating, attaching and dropping its \
                   partitions)"
                .to_owned(),
            command: command.to_owned(),
            message: format!(
                "only the inbox's owner {:?} or a member of it may (docs/OPERATIONS.md, \
                 \"Database roles and grants\")",
                row.get::<_, String>(1)
            ),
        }),
        _ => Ok(()),
    }
}

/// Fails with [`DbError::Denied`] (or [`DbError::Grant`], when the table is one of the
/// pipeline's) when the role of `pool` may not run `statement` (`what` it is, for the message),
/// run on empty input in a transaction that is rolled back.
pub(crate) async fn check_statement(
    pool: &Pool,
    command: &str,
    what: &str,
    statement: &str,
) -> Result<(), DbError> {
    let mut client = pool.get().await?;
    let tx = client.transaction().await?;
    match run_one(&tx, statement).await? {
        Some(denied) => Err(diagnose(&tx, command, &[], what, &denied).await?),
        None => Ok(()),
    }
}

/// Runs `statement` on empty input in a savepoint; `Some` with the server's message when a
/// privilege is missing.
async fn run_one(
    tx: &deadpool_postgres::Transaction<'_>,
    statement: &str,
) -> Result<Option<String>, DbError> {
    tx.batch_execute("SAVEPOINT grant_check").await?;
    let outcome = match tx.prepare(statement).await {
        Ok(stmt) => {
            let params: Vec<&(dyn ToSql + Sync)> =
                stmt.params().iter().map(|_| &Empty as _).collect();
            tx.execute(&stmt, &params).await.map(drop)
        }
        Err(e) => Err(e),
    };
    let denied = match outcome {
        Ok(()) => None,
        Err(e) if e.code() == Some(&SqlState::INSUFFICIENT_PRIVILEGE) => {
            Some(crate::one_line::pg_line(&e))
        }
        // Not created yet: the schema check says which `migrate` creates it.
        Err(e) if e.code() == Some(&SqlState::UNDEFINED_TABLE) => None,
        // Any other server error came after the privilege check (a NULL in a NOT NULL
        // column): the privileges are there. A lost connection is not an answer.
        Err(e) if e.as_db_error().is_some() => None,
        Err(e) => return Err(DbError::Postgres(e)),
    };
    tx.batch_execute("ROLLBACK TO SAVEPOINT grant_check")
        .await?;
    Ok(denied)
}

/// The error for a statement refused with `message`: the first of `needs` the role lacks, or
/// the server's message when it lacks none of them.
async fn diagnose(
    tx: &impl GenericClient,
    command: &str,
    needs: &[(&str, &str)],
    what: &str,
    message: &str,
) -> Result<DbError, DbError> {
    let role: String = tx.query_one("SELECT current_user::text", &[]).await?.get(0);
    for (table, privilege) in needs {
        let has: bool = tx
            .query_one("SELECT has_table_privilege($1, $2)", &[table, privilege])
            .await?
            .get(0);
        if !has {
            return Ok(DbError::Grant {
                role,
                table: (*table).to_owned(),
                privilege: (*privilege).to_owned(),
                command: command.to_owned(),
            });
        }
    }
    Ok(DbError::Denied {
        role,
        what: what.to_owned(),
        command: command.to_owned(),
        message: message.to_owned(),
    })
}

/// A parameter of any type with no value: an empty array for an array parameter or a JSON one
/// (`[]`, the SQL handler's empty batch), NULL for any other.
#[derive(Debug)]
struct Empty;

impl ToSql for Empty {
    fn to_sql(
        &self,
        ty: &Type,
        out: &mut bytes::BytesMut,
    ) -> Result<IsNull, Box<dyn std::error::Error + Sync + Send>> {
        use bytes::BufMut;
        match ty.kind() {
            // An empty batch, as the SQL handler's `$1` would be one (jsonb: a version byte).
            _ if *ty == Type::JSONB => {
                out.put_u8(1);
                out.put_slice(b"[]");
                Ok(IsNull::No)
            }
            _ if *ty == Type::JSON => {
                out.put_slice(b"[]");
                Ok(IsNull::No)
            }
            Kind::Array(member) => {
                // The binary array format: no dimension, no NULL, the element type.
                out.put_i32(0);
                out.put_i32(0);
                out.put_u32(member.oid());
                Ok(IsNull::No)
            }
            _ => Ok(IsNull::Yes),
        }
    }

    fn accepts(_: &Type) -> bool {
        true
    }

    to_sql_checked!();
}
