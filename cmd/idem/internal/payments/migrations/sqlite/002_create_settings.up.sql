-- Settings the service keeps in its database: the demo tenant's token, so
-- that the curl lines a first start printed keep working after a restart.
CREATE TABLE payments_settings (
    name  TEXT NOT NULL CONSTRAINT payments_settings_pkey PRIMARY KEY,
    value TEXT NOT NULL
);
