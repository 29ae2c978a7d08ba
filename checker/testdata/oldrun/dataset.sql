-- The tables of the stored old-format run (run.json), on both sides of a MariaDB pair:
-- TestResumeOldFormatRun creates them, write_old_run.go.txt made run.json from them with
-- the previous release. Sections: "-- both" runs on both sides, "-- upstream" and
-- "-- downstream" plant the differences, "-- repair" runs downstream after the old run
-- stopped (its difference is stored; the resumed run's re-check must resolve it).
-- Statements end with ";" at the end of a line.

-- both
CREATE TABLE a_keyless (x INT NOT NULL, y VARCHAR(10) NULL, f DOUBLE NULL, KEY (x)) DEFAULT CHARSET utf8mb4;
INSERT INTO a_keyless SELECT seq % 50, IF(seq % 7 = 0, NULL, CONCAT('y', seq % 13)), IF(seq % 5 = 0, NULL, seq * 1e19 / 3) FROM seq_1_to_400;
CREATE TABLE ck (
  a VARCHAR(20) COLLATE utf8mb4_general_ci NOT NULL,
  b BIGINT UNSIGNED NOT NULL,
  c DECIMAL(8,2) NOT NULL,
  d DATETIME(3) NOT NULL,
  e VARBINARY(4) NOT NULL,
  v VARCHAR(40),
  PRIMARY KEY (a, b, c, d, e)
) DEFAULT CHARSET utf8mb4;
INSERT INTO ck SELECT CONCAT('k', LPAD(seq, 4, '0')), IF(seq % 2 = 0, 18446744073709551615 - seq, seq), CAST(seq AS SIGNED) / 4 - 100, TIMESTAMP'2024-02-29 23:59:59.500' + INTERVAL seq SECOND, UNHEX(LPAD(HEX(seq * 7), 6, '0')), CONCAT('v', seq) FROM seq_1_to_2000;
INSERT INTO ck VALUES ('Ésa', 5, 0.5, '2000-01-01 00:00:00.000', X'00', 'accent'), ('o''k', 9223372036854775808, -0.01, '1999-12-31 23:59:59.999', X'27', 'quote'), ('tab\there', 0, 999999.99, '2038-01-19 03:14:07.000', X'', 'tab');
CREATE TABLE ik (id INT PRIMARY KEY, v VARCHAR(20)) DEFAULT CHARSET utf8mb4;
INSERT INTO ik SELECT CAST(seq AS SIGNED) - 1000, CONCAT('w', seq) FROM seq_1_to_3000;

-- upstream
INSERT INTO a_keyless VALUES (3, NULL, 1e21), (4, 'it''s', -0.000001);
UPDATE a_keyless SET f = 2.5 WHERE x = 9 AND y = 'y9';
UPDATE ck SET v = 'accent2' WHERE a = 'Ésa';
UPDATE ck SET v = 'late' WHERE a = 'k1700';
UPDATE ck SET v = 'quote2' WHERE a = 'o''k';
UPDATE ik SET v = 'changed' WHERE id = 1500;

-- downstream
INSERT INTO a_keyless SELECT x, y, f FROM a_keyless WHERE x = 7 ORDER BY y, f LIMIT 1;
DELETE FROM ck WHERE a = 'k0050';
UPDATE ck SET v = 'rogue' WHERE a = 'k0123';
UPDATE ck SET v = 'repaired later' WHERE a = 'k0400';
INSERT INTO ck VALUES ('k0300x', 1, 1, '2024-01-01', X'01', 'extra');
DELETE FROM ck WHERE a = 'k1500';
DELETE FROM ck WHERE a = 'tab\there';
INSERT INTO ck VALUES ('zzz', 2, 2, '2024-01-01', X'02', 'extra2');
DELETE FROM ik WHERE id = -900;
INSERT INTO ik VALUES (5000, 'extra');

-- repair
UPDATE ck SET v = 'v400' WHERE a = 'k0400';
