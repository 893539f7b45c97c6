-- Settings the service keeps in its database: the demo tenant's token, so
-- that the curl lines a first start printed keep working after a restart.
-- {{schema}} is the quoted schema name and a dot.
CREATE TABLE {{schema}}payments_settings (
    name  text NOT NULL,
    value text NOT NULL,
    CONSTRAINT payments_settings_pkey PRIMARY KEY (name)
);
