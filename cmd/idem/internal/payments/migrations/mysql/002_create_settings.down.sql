DROP TABLE IF EXISTS payments_settings;
