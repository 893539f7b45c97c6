-- Settings the service keeps in its database: the demo tenant's token, so
-- that the curl lines a first start printed keep working after a restart.
CREATE TABLE IF NOT EXISTS payments_settings (
    name  VARBINARY(255) NOT NULL,
    value TEXT CHARACTER SET utf8mb4 COLLATE utf8mb4_bin NOT NULL,
    CONSTRAINT payments_settings_pkey PRIMARY KEY (name)
) ENGINE = InnoDB;
