-- Statements of the MySQL dialect, in the format of internal/sqlfile, for
-- MySQL 8 and MariaDB 10.6+. {{table}} is the migrations table's quoted
-- name and {{pkey}} the name of its primary key constraint. Locked runs them
-- on one connection holding a named lock (GET_LOCK): MySQL commits DDL at
-- once, so there is no transaction to hold one.

-- name: lock
-- Waits up to ?2 seconds for the named lock ?1: 1 when taken, 0 on timeout.
SELECT GET_LOCK(?, ?);

-- name: unlock
-- ?1 the lock's name.
SELECT RELEASE_LOCK(?);

-- name: database
-- The connection's database, which holds the migrations table (NULL when
-- the connection names none).
SELECT DATABASE();

-- name: create_table
CREATE TABLE IF NOT EXISTS {{table}} (
    version    INT          NOT NULL,
    name       VARCHAR(255) NOT NULL,
    applied_at DATETIME(6)  NOT NULL,
    CONSTRAINT {{pkey}} PRIMARY KEY (version)
) ENGINE = InnoDB;

-- name: table_exists
-- ?1 the table's name, unquoted.
SELECT EXISTS (SELECT 1 FROM information_schema.tables
               WHERE table_schema = DATABASE() AND table_name = ?);

-- name: applied
SELECT version, applied_at FROM {{table}};

-- name: record
-- ?1 version, ?2 name, ?3 applied_at (the runner's clock, UTC).
INSERT INTO {{table}} (version, name, applied_at) VALUES (?, ?, ?);

-- name: unrecord
-- ?1 version.
DELETE FROM {{table}} WHERE version = ?;
